"""The ``torq-gen-config`` command: one console script with subcommands.

Each subcommand lives in its own module with an ``add_parser`` and a ``run``
function (the Polygraphy layout). Errors meant for the user end the command with a
one-line ``torq-gen-config: error: ...`` and exit status 2.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import warnings

from . import compare, conformance, discover, edit, report, run, sweep, view
from .. import __version__
from ..core.errors import TorqGenConfigError


#: Commands that only print: a reader that closes the pipe early (`view | head`) is no failure.
READ_ONLY_COMMANDS = ("view",)


def only_prints(args: argparse.Namespace) -> bool:
    """Whether the command only prints (:data:`READ_ONLY_COMMANDS`, ``edit --list``)."""
    return args.command in READ_ONLY_COMMANDS or (args.command == "edit"
                                                  and getattr(args, "list_filter", None) is not None)


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse's parser whose usage errors are one line, ``prog: error: message (see prog
    --help)``, without the usage block first (28 lines for ``discover``); exit status 2 as
    argparse's. Subcommand parsers are of the same class (``add_subparsers`` uses it)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with all subcommands registered."""
    parser = OneLineErrorParser(
        prog="torq-gen-config",
        description="Find, layer by layer, which executor runs an ONNX model correctly and fastest, "
                    "and write the per-op assignment for the compiler.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    discover.add_parser(sub)
    view.add_parser(sub)
    edit.add_parser(sub)
    run.add_parser(sub)
    report.add_parser(sub)
    conformance.add_parser(sub)
    compare.add_parser(sub)
    sweep.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        status = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not at exit (where it prints a traceback)
        return status
    except BrokenPipeError:
        # the reader stopped reading (`view | head`): what it wanted was printed. Python's
        # recipe (docs: signal, "Note on SIGPIPE"): send the rest to /dev/null, no traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0 if only_prints(args) else 1
    except TorqGenConfigError as e:
        print(f"torq-gen-config: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a read-only or full output directory, a vanished file
        where = f" ({e.filename})" if getattr(e, "filename", None) else ""
        print(f"torq-gen-config: error: {e.strerror or e}{where}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        # Snakemake's coroutines cut short by the stop warn when collected at exit
        # ("coroutine ... never awaited"); asyncio logs "Task was destroyed but it is pending!"
        warnings.filterwarnings("ignore", message=r"coroutine .* was never awaited", category=RuntimeWarning)
        logging.getLogger("asyncio").setLevel(logging.CRITICAL)
        signum = getattr(e, "signum", signal.SIGINT)  # workflow_api.Interrupted: Ctrl-C or SIGTERM
        what = "interrupted" if signum == signal.SIGINT else f"stopped by {signal.Signals(signum).name}"
        kept = getattr(args, "kept_on_interrupt", "finished layers are kept")
        print(f"torq-gen-config: {what}; {kept}, rerun the same command to resume", file=sys.stderr)
        return 128 + int(signum)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
