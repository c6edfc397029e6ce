"""``specdec`` command line: the Typer app and its commands, each a thin module over :mod:`specdec_cli.api`.

Every user-facing problem is a :class:`~specdec_cli.errors.SpecdecError`, printed as one line on stderr
(``commands/common.py``).
"""

from __future__ import annotations

import typer

from .commands import bench
from .commands import datastore
from .commands import drafting
from .commands import entropy
from .commands import generate
from .commands import info

app = typer.Typer(
    name="specdec",
    help="Training-free, lossless speculative decoding for Hugging Face causal LMs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

for command in (generate, bench, datastore, drafting, entropy, info):
    command.register(app)


def main() -> None:
    """The ``specdec`` command. Click's own errors (a bad or unknown option, a value of the wrong type) are one
    ``specdec: error:`` line with exit code 2 too, like every other user error, not a usage box."""
    import signal
    import sys

    try:
        from typer._click import exceptions as click  # typer >= 0.25 parses with its own copy of click
    except ImportError:
        from click import exceptions as click

    def terminated(signum, frame):  # SIGTERM unwinds like Ctrl-C: temp files are removed, partial results kept
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, terminated)
    try:
        code = app(standalone_mode=False, prog_name="specdec")
    except click.NoArgsIsHelpError as err:  # bare `specdec`: the help, as asked for
        err.show()
        code = err.exit_code
    except click.ClickException as err:
        ctx = getattr(err, "ctx", None)
        hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
        message = " ".join(f"{err.format_message()}{hint}".split())
        sys.stderr.write(f"specdec: error: {message}\n")
        code = 2 if isinstance(err, click.UsageError) else err.exit_code
    except typer.Abort:
        sys.stderr.write("specdec: error: interrupted\n")
        code = 130
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
