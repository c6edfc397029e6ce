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
    import signal

    def terminated(signum, frame):  # SIGTERM unwinds like Ctrl-C: temp files are removed, partial results kept
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, terminated)
    app()


if __name__ == "__main__":
    main()
