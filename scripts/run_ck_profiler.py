#!/usr/bin/env python3
"""The seed's runner command line: python scripts/run_ck_profiler.py CONFIGS --profiler-path DIR
[--max-ops N] [--dry-run] [--quiet] [--no-save] [--output FILE]. Same as `ck-profile run`; the
logic is in torq_gen_config.ck (docs/ck_profile.md)."""
import os
import sys

try:
    from torq_gen_config.ck.cli import run_main
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "workflow"))
    from torq_gen_config.ck.cli import run_main

if __name__ == "__main__":
    sys.exit(run_main())
