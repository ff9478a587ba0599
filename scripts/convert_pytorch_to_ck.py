#!/usr/bin/env python3
"""The seed's converter command line: python scripts/convert_pytorch_to_ck.py [IN] [OUT].
Same as `ck-profile convert`; the logic is in torq_gen_config.ck (docs/ck_profile.md)."""
import os
import sys

try:
    from torq_gen_config.ck.cli import convert_main
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "workflow"))
    from torq_gen_config.ck.cli import convert_main

if __name__ == "__main__":
    sys.exit(convert_main())
