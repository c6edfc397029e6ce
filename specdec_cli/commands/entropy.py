"""``specdec inspect-entropy``: entropy of accepted vs rejected draft tokens under vanilla SD (paper Figure 6).

A thin layer over :mod:`specdec_cli.bench.entropy`.
"""

from __future__ import annotations

import json
from typing import List, Optional

import typer

from . import options as flags


def read_entropy_prompts(prompts: Optional[List[str]], prompts_file: Optional[str], use_stdin: bool) -> list[str]:
    """Prompt arguments, plus one prompt per non-empty line of ``--prompts-file`` and of stdin (``--stdin``)."""
    from ..errors import SpecdecError

    from .common import read_prompt_lines

    out = list(prompts or [])
    if prompts_file:
        out += read_prompt_lines(prompts_file, "--prompts-file")
    if use_stdin:
        out += read_prompt_lines("-", "--stdin")
    if not out:
        raise SpecdecError("no prompts: give them as arguments, with --prompts-file FILE, or with --stdin")
    return out


def render_table(report: dict, meta: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Draft entropy H(q_draft) in nats -- sd, K={meta['window']}, {meta['draft']} -> {meta['model']}")
    for col in ("tokens", "count", "mean", "median", "q1", "q3", "min", "max"):
        table.add_column(col, justify="left" if col == "tokens" else "right")
    for group in ("accepted", "rejected"):
        d = report[group]
        cells = [f"{d[k]:.3f}" if d[k] is not None else "-" for k in ("mean", "median", "q1", "q3", "min", "max")]
        table.add_row(group, str(d["count"]), *cells)
    console = Console()
    console.print(table)
    tau = report["learned_tau"]
    if tau is None:
        console.print("no draft token was rejected: self-verify would keep tau at its initial value")
        return
    console.print(f"self-verify would learn tau = {tau:.3f} (mean entropy of rejected tokens); "
                  f"accepted with H <= tau: {report['accepted_at_or_below_tau']:.0%}, "
                  f"rejected with H > tau: {report['rejected_above_tau']:.0%}; "
                  f"{report['unverified']} tokens after a rejection were never judged")


def register(app: typer.Typer) -> None:
    app.command("inspect-entropy")(inspect_entropy)


def inspect_entropy(
    prompts: Optional[List[str]] = typer.Argument(None, help="prompt texts"),
    prompts_file: Optional[str] = typer.Option(None, "--prompts-file", help="one prompt per line"),
    use_stdin: bool = typer.Option(False, "--stdin", help="read prompts from stdin, one per line"),
    model: str = flags.MODEL,
    draft: str = typer.Option("int8:", "--draft", "-d", help="draft model (also int8: / bf16: copies of the target)"),
    window: int = typer.Option(5, "--window", "-k", help="fixed draft window K of the sd run"),
    max_new_tokens: int = typer.Option(64, "--max-new-tokens", "-n", help="tokens to generate per prompt"),
    temperature: float = typer.Option(0.0, "--temperature", "-t", help="0 = greedy (entropy of the draft's softmax)"),
    seed: int = flags.SEED,
    dtype: str = flags.DTYPE,
    device: str = flags.DEVICE,
    threads: Optional[int] = flags.THREADS,
    raw: bool = flags.RAW,
    plot: Optional[str] = typer.Option(None, "--plot", help="write a PNG histogram here"),
    as_json: bool = typer.Option(False, "--json", help="print the report as one JSON object"),
) -> None:
    """Entropy of accepted vs rejected draft tokens under vanilla SD, and the tau self-verify would learn."""
    from .common import quiet_libraries, user_errors
    from ..errors import SpecdecError

    with user_errors():
        from ..config import PAPER_BUDGET, RunSettings, SamplingConfig

        texts = read_entropy_prompts(prompts, prompts_file, use_stdin)
        settings = RunSettings(max_new_tokens, SamplingConfig(temperature), seed, window, PAPER_BUDGET, threads)
        from .. import api  # torch: only now that the arguments are known to be good
        from ..bench import entropy as entropy_stats
        from ..runtime.machine import set_threads

        set_threads(settings.threads)
        quiet_libraries()
        target, (draft_model,) = api.load(model, [draft], dtype, device)
        from ..io.models import same_vocab

        if not same_vocab(target, draft_model):
            raise SpecdecError(f"inspect-entropy compares the draft's token distributions with the target's verdicts "
                               f"token by token: --draft {draft} must share the target's tokenizer (int8:, bf16:, or "
                               "a model of the same vocabulary)")
        ids = [api.encode_prompt(target, t, raw=raw, max_new_tokens=max_new_tokens) for t in texts]
        sample = entropy_stats.collect_entropies(target, draft_model, ids, window=window,
                                                 max_new_tokens=max_new_tokens, sampling=settings.sampling, seed=seed)
        report = entropy_stats.entropy_report(sample)
        meta = {"model": model, "draft": draft, "window": window, "prompts": len(texts),
                "max_new_tokens": max_new_tokens, "temperature": temperature}
        if plot:
            try:
                entropy_stats.plot_histogram(sample, plot)
            except OSError as err:
                raise SpecdecError(f"cannot write --plot {plot}: {err.strerror or err}") from None
        if as_json:
            print(json.dumps({**meta, **report, "plot": plot}))
        else:
            render_table(report, meta)
            if plot:
                print(f"histogram written to {plot}")
