"""``specdec bench``: side-by-side benchmark of decoding methods on a prompt set (see docs/bench.md).

Exit codes: 0 ok, 2 user error (one line on stderr), 3 ``--compare`` found a regression.
"""

from __future__ import annotations

import json
import sys
from typing import List, Optional

import typer

from .common import COMPILE_HELP

METHODS_HELP = ("comma-separated: auto, ar, sd, self-verify, hsddw, rest, aded, ngram-trie, pld, and transformers' "
                "baselines hf, hf-assisted (uses the first --draft), hf-pld, hf-static; ar is always included")
BUDGET_HELP = ("draft budget of our methods: auto (verify what pays off on this machine, measured), paper (each "
               "paper's fixed settings) or N (the N draft tokens most likely accepted)")
KERNELS_HELP = "target's CPU linear kernels: auto (measured per row count, cached) or torch (PyTorch's own)"
PROMPTS_HELP = "mt-bench, humaneval, gsm8k, alpaca, rag, gsm8k-sample, alpaca-sample, or a .jsonl file"


def check_cheap_arguments(methods, tolerance, budget, compile, max_new_tokens, window, temperature, threads,
                          options) -> None:
    """Everything that needs no model and no torch, before either is imported (an error comes in well under 1 s)."""
    from ..errors import SpecdecError
    from ..methods import METHODS, check_options
    from ..config import HF_BASELINES, SamplingConfig, parse_budget
    from .common import check_compile

    if not 0 <= tolerance < 1:
        raise SpecdecError(f"--tolerance must be a fraction in [0, 1), got {tolerance}")
    for name in methods:
        if name not in METHODS and name not in HF_BASELINES:
            raise SpecdecError(f"unknown method {name!r}; choose from {', '.join([*METHODS, *HF_BASELINES])}")
    parse_budget(budget)
    check_compile(compile)
    if max_new_tokens < 1:
        raise SpecdecError(f"--max-new-tokens must be >= 1, got {max_new_tokens}")
    if window is not None and window < 1:
        raise SpecdecError(f"--window must be >= 1, got {window}")
    if threads is not None and threads < 1:
        raise SpecdecError(f"--threads must be >= 1, got {threads}")
    SamplingConfig(temperature=temperature).validate()
    check_options([m for m in methods if m in METHODS] or ["ar"], options)


def split_methods(methods: List[str]) -> list[str]:
    return [m.strip() for item in methods for m in item.split(",") if m.strip()]


def bench(
    model: str = typer.Option("smollm2-135m", "--model", "-m", help="target model (alias, hub id or local path)"),
    draft: Optional[List[str]] = typer.Option(None, "--draft", "-d", help="draft model (repeatable; int8:, bf16: copies)"),
    methods: List[str] = typer.Option(["ar,auto"], "--methods", help=METHODS_HELP),
    prompts: str = typer.Option("mt-bench", "--prompts", "-p", help=PROMPTS_HELP),
    limit: Optional[int] = typer.Option(None, "--limit", help="first N prompts (after --category and --offset)"),
    offset: int = typer.Option(0, "--offset", help="skip the first N prompts (after --category): shard a long run"),
    category: Optional[str] = typer.Option(None, "--category", help="only prompts of this category (e.g. MT-Bench 'coding')"),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens", "-n"),
    temperature: float = typer.Option(0.0, "--temperature", "-t", help="0 = greedy; > 0 skips the identity check"),
    seed: int = typer.Option(0, "--seed"),
    warmup: bool = typer.Option(True, "--warmup/--no-warmup", help="one untimed short generation per method first"),
    dtype: str = typer.Option("auto", "--dtype"),
    device: str = typer.Option("auto", "--device"),
    threads: Optional[int] = typer.Option(None, "--threads", help="torch CPU threads (default: torch's choice)"),
    budget: str = typer.Option("auto", "--budget", help=BUDGET_HELP),
    kernels: str = typer.Option("auto", "--kernels", help=KERNELS_HELP),
    compile: str = typer.Option("auto", "--compile", help=COMPILE_HELP),
    datastore: Optional[List[str]] = typer.Option(None, "--datastore", help="datastore directory for rest/aded; "
                                                  "repeatable as METHOD=DIR, e.g. rest=DIR and aded=DIR; auto=DIR "
                                                  "(repeatable, any kind) for auto"),
    memory: Optional[str] = typer.Option(None, "--memory", help="auto: keep its memory of outputs in this folder "
                                         "across runs (default: this run only, so runs are reproducible)"),
    window: Optional[int] = typer.Option(None, "--window", "-k", help="draft window K (method default when unset)"),
    opt: Optional[List[str]] = typer.Option(None, "--opt", help="method option key=value (repeatable)"),
    out: Optional[str] = typer.Option(None, "--out", help="append this run's record to a JSONL file (finished "
                                      "generations are kept in OUT.partial until then)"),
    resume: bool = typer.Option(False, "--resume", help="continue an interrupted run with the same options and --out"),
    compare_to: Optional[str] = typer.Option(None, "--compare", help="JSONL of earlier records; regressions exit 3"),
    tolerance: float = typer.Option(0.10, "--tolerance", help="allowed relative speedup drop for --compare"),
    plot: Optional[str] = typer.Option(None, "--plot", help="write a PNG bar chart of speedups"),
    as_json: bool = typer.Option(False, "--json", help="print the record as one JSON object instead of a table"),
) -> None:
    """Benchmark methods side by side: tokens/s, speedup vs ar, accepted length, sigma, eta, identical outputs."""
    from .common import parse_opts, quiet_libraries, user_errors

    with user_errors():
        check_cheap_arguments(split_methods(methods), tolerance, budget, compile, max_new_tokens, window, temperature,
                              threads, parse_opts(opt))
        from .. import api
        from .. import bench as lib

        cfg = lib.BenchConfig(model=model, drafts=list(draft or []), methods=split_methods(methods), prompts=prompts,
                              limit=limit, offset=offset, category=category, max_new_tokens=max_new_tokens,
                              temperature=temperature, seed=seed, warmup=warmup, dtype=dtype, device=device,
                              datastore=list(datastore or []), window=window,
                              options={**parse_opts(opt), **({"memory_dir": memory} if memory else {})},
                              threads=threads,
                              budget=budget, kernels=kernels, compile=compile)
        cfg.methods = lib.method_list(cfg.methods)  # fail on a typo before loading anything
        if memory:
            from ..drafting.output_memory import check_folder

            check_folder(memory)
        from dataclasses import asdict

        from ..bench.checkpoint import Checkpoint
        from ..runtime.machine import set_threads
        from ..errors import Interrupted

        set_threads(threads)
        lib.datastore_for("rest", cfg.datastore)  # ... and on ambiguous --datastore values
        from ..methods import check_options, precheck_datastore

        check_options([m for m in cfg.methods if m in api.METHODS], cfg.options)
        stores, opened = [], {}  # each store opened once, shared by the methods
        for name in cfg.methods:
            found = lib.datastore_for(name, cfg.datastore)
            precheck_datastore(name, found, opened)
            stores += [found] if isinstance(found, str) else list(found or [])
        if stores:  # of another tokenizer: said with the tokenizer alone, before the weights load
            from ..datastore import check_stores_tokenizer

            check_stores_tokenizer(sorted(set(stores)), model)
        # every file the run reads or writes at its end is checked now: a bad one never costs a finished run
        old_records = lib.read_records(compare_to) if compare_to else None
        if plot:
            lib.check_plot_path(plot)
        if out:
            lib.check_out_file(out)
        checkpoint = Checkpoint(out, asdict(cfg), resume)  # locks OUT.partial: a second run on --out is refused
        quiet_libraries()
        prompt_list = lib.load_prompts(cfg.prompts, cfg.limit, cfg.category, cfg.offset)  # before the model loads
        target, drafts = api.load(model, cfg.drafts, dtype, device, kernels)
        try:
            record = lib.benchmark(cfg, target, drafts, checkpoint, prompt_list, opened)
        except KeyboardInterrupt:
            hint = f"; finished generations are in {checkpoint.path}: rerun with --resume" if out else ""
            raise Interrupted(f"interrupted{hint}") from None
        findings = lib.compare(record, old_records, tolerance) if old_records is not None else None
        if out:
            lib.append_record(out, record)
            checkpoint.finish()
        if plot:
            lib.plot_speedups(record, plot)
        report(lib, record, findings, tolerance, as_json)
        if findings and lib.has_regression(findings):
            raise typer.Exit(lib.REGRESSION_EXIT_CODE)


def report(lib, record: dict, findings, tolerance: float, as_json: bool) -> None:
    if as_json:
        print(json.dumps({**record, **({"compare": findings} if findings is not None else {})}), flush=True)
        return
    lib.print_table(record, terminal=sys.stdout.isatty())
    if findings is not None:
        print(lib.comparison_text(findings, tolerance))
    sys.stdout.flush()


def bench_merge(
    files: List[str] = typer.Argument(..., help="JSONL files written by bench --out (the last record of each)"),
    all_records: bool = typer.Option(False, "--all", help="merge every record of the files, not the last of each"),
    out: Optional[str] = typer.Option(None, "--out", help="append the merged record to a JSONL file"),
    plot: Optional[str] = typer.Option(None, "--plot", help="write a PNG bar chart of speedups"),
    as_json: bool = typer.Option(False, "--json", help="print the merged record as one JSON object"),
) -> None:
    """Merge shards of one benchmark (bench --offset/--limit runs over disjoint prompts) into one record."""
    from .common import user_errors

    with user_errors():
        from .. import bench as lib
        from ..errors import SpecdecError

        if out:
            lib.check_out_file(out)
        if plot:
            lib.check_plot_path(plot)
        records = []
        for path in files:
            found = lib.read_records(path, "record file", merge=True)
            if not found:
                raise SpecdecError(f"no records in {path}")
            records += found if all_records else found[-1:]
        record = lib.merge_records(records)
        if out:
            lib.append_record(out, record)
        if plot:
            lib.plot_speedups(record, plot)
        report(lib, record, None, 0.0, as_json)


def register(app: typer.Typer) -> None:
    app.command("bench")(bench)
    app.command("bench-merge")(bench_merge)
