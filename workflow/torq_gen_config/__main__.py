"""``python -m torq_gen_config`` is the same as the ``torq-gen-config`` command."""

import sys

from .cli.main import main

sys.exit(main())
