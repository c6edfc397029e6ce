"""``specdec bench-drafting``: time one drafting step of a model-free drafter (the methods registry's
``model_free()``) on realistic contexts, without a target model (``specdec_cli.bench.drafting``)."""

from __future__ import annotations

import json
from typing import Optional

import typer

from ..methods import model_free

MODEL_FREE = ", ".join(model_free())


def register(app: typer.Typer) -> None:
    app.command("bench-drafting")(bench_drafting)


def bench_drafting(
    method: str = typer.Option("rest", "--method", help=MODEL_FREE),
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
