"""``specdec bench``: side-by-side benchmark of decoding methods on a prompt set (see docs/bench.md).

Exit codes: 0 ok, 2 user error (one line on stderr), 3 ``--compare`` found a regression.
"""

from __future__ import annotations

import json
import sys
from typing import List, Optional

import typer

from ..errors import SpecdecError
from . import options as flags

METHODS_HELP = (f"comma-separated: {flags.METHOD_NAMES}, and transformers' baselines {flags.BASELINE_NAMES} "
                "(hf-assisted uses the first --draft); ar is always included")
OUT_HELP = "append this run's record to a JSONL file (finished generations are kept in OUT.partial until then)"
PROMPTS_HELP = f"a prompt set ({flags.PROMPT_SET_NAMES}; NAME*K repeats each prompt K times) or a .jsonl file"
DATASTORE_HELP = ("datastore directory for rest/aded; repeatable as METHOD=DIR, e.g. rest=DIR and aded=DIR; auto=DIR "
                  "(repeatable, any kind) for auto")


def split_methods(methods: List[str]) -> list[str]:
    return [m.strip() for item in methods for m in item.split(",") if m.strip()]


def bench(
    model: str = flags.MODEL,
    draft: Optional[List[str]] = flags.DRAFTS,
    methods: List[str] = typer.Option(["ar,auto"], "--methods", help=METHODS_HELP),
    prompts: str = typer.Option("mt-bench", "--prompts", "-p", help=PROMPTS_HELP),
    limit: Optional[int] = typer.Option(None, "--limit", help="first N prompts (after --category and --offset)"),
    offset: int = typer.Option(0, "--offset", help="skip the first N prompts (after --category): shard a long run"),
    category: Optional[str] = typer.Option(None, "--category", help="only prompts of this category (e.g. MT-Bench 'coding')"),
    max_new_tokens: int = flags.MAX_NEW_TOKENS,
    temperature: float = typer.Option(0.0, "--temperature", "-t", help="0 = greedy; > 0 skips the identity check"),
    seed: int = flags.SEED,
    warmup: bool = typer.Option(True, "--warmup/--no-warmup", help="one untimed short generation per method first"),
    dtype: str = flags.DTYPE,
    device: str = flags.DEVICE,
    threads: Optional[int] = flags.THREADS,
    budget: str = flags.BUDGET,
    kernels: str = flags.KERNELS,
    compile: str = flags.COMPILE,
    datastore: Optional[List[str]] = typer.Option(None, "--datastore", help=DATASTORE_HELP),
    memory: Optional[str] = flags.MEMORY,
    window: Optional[int] = flags.WINDOW,
    opt: Optional[List[str]] = flags.OPT,
    out: Optional[str] = typer.Option(None, "--out", help=OUT_HELP),
    resume: bool = typer.Option(False, "--resume", help="continue an interrupted run with the same options and --out"),
    compare_to: Optional[str] = typer.Option(None, "--compare", help="JSONL of earlier records; regressions exit 3"),
    tolerance: float = typer.Option(0.10, "--tolerance", help="allowed relative speedup drop for --compare"),
    plot: Optional[str] = flags.PLOT,
    as_json: bool = typer.Option(False, "--json", help="print the record as one JSON object instead of a table"),
    batch_size: Optional[str] = typer.Option(None, "--batch-size", help=flags.BATCH_SIZES_HELP),
    engine: str = flags.ENGINE,
    tensor_parallel_size: Optional[int] = flags.TENSOR_PARALLEL,
    pipeline_parallel_size: Optional[int] = flags.PIPELINE_PARALLEL,
    distributed_executor_backend: Optional[str] = flags.EXECUTOR,
    vllm_arg: Optional[List[str]] = flags.VLLM_ARG,
) -> None:
    """Benchmark methods side by side: tokens/s, speedup vs ar, accepted length, sigma, eta, identical outputs."""
    from .common import parse_opts, user_errors

    with user_errors():
        from ..config import BatchSizes, RunSettings, SamplingConfig, check_placement
        if not 0 <= tolerance < 1:
            raise SpecdecError(f"--tolerance must be a fraction in [0, 1), got {tolerance}")
        settings = RunSettings(max_new_tokens, SamplingConfig(temperature), seed, window, budget, threads)  # checked
        check_placement(dtype, kernels)
        names, options = split_methods(methods), {**parse_opts(opt), **({"memory_dir": memory} if memory else {})}
        labels = check_methods_and_options(names, options, compile, memory, engine)
        vllm = bench_vllm_settings(labels, engine, (tensor_parallel_size, pipeline_parallel_size,
                                   distributed_executor_backend, vllm_arg), options, datastore)
        from .. import bench as lib

        cfg = lib.BenchConfig(model=model, drafts=list(draft or []), methods=labels, prompts=prompts,
                              limit=limit, offset=offset, category=category, settings=settings, warmup=warmup,
                              dtype=dtype, device=device, datastore=list(datastore or []), options=options,
                              kernels=kernels, compile=compile, engine=engine, vllm=vllm)
        if batch_size is None:
            return run_bench(lib, cfg, out, resume, compare_to, tolerance, plot, as_json)
        run_throughput(lib, cfg, BatchSizes.parse(batch_size), names, out, (resume, compare_to, plot), as_json)


def run_throughput(lib, cfg, sizes, names: list[str], out, refused, as_json: bool) -> None:
    """``--batch-size``: the throughput mode (specdec_cli.bench.throughput), at each of ``sizes``
    (:class:`~specdec_cli.config.BatchSizes`)."""
    from ..bench import throughput
    from .. import api
    from ..runtime.machine import set_threads
    from .common import quiet_libraries

    if any(refused):
        raise SpecdecError("--resume, --compare and --plot belong to the latency mode; drop them with --batch-size")
    cfg.methods = throughput.check_methods(names, cfg.engine)  # ar runs sequentially anyway; listed, batched too
    if out:
        throughput.check_out(out)
    set_threads(cfg.settings.threads)
    opened = check_stores(lib, cfg)
    quiet_libraries()
    prompt_list = lib.load_prompts(cfg.prompts, cfg.limit, cfg.category, cfg.offset)
    target, drafts = api.load(cfg.model, cfg.drafts, cfg.dtype, cfg.device, cfg.kernels)
    record = throughput.throughput(cfg, target, drafts, prompt_list, sizes, opened)
    if out:
        lib.append_record(out, record)
    if as_json:
        print(json.dumps(record), flush=True)
    else:
        throughput.print_table(record)


def load_models(api, cfg):
    """The target and drafts when a method runs on specdec's engine; the model's text side alone otherwise
    (vLLM loads the weights in its own processes)."""
    from ..bench.labels import engine_of

    if any(engine_of(m, cfg.engine) == "specdec" for m in cfg.methods):
        return api.load(cfg.model, cfg.drafts, cfg.dtype, cfg.device, cfg.kernels)
    return api.load_text(cfg.model), []


def check_methods_and_options(names: list[str], options: dict, compile: str, memory: Optional[str],
                              engine: str = "specdec") -> list[str]:
    """Method labels (``NAME`` or ``NAME@ENGINE``), --opt values (against every method of the run that takes
    them), --compile, --memory: all before torch is imported (an error comes in well under 1 s). Returns the run's
    labels, its baseline first."""
    from ..bench.baselines import OUTSIDE_BASELINES
    from ..bench.labels import method_list, split_label
    from ..methods import check_options
    from ..runtime.cache_mode import check as check_compile

    labels = method_list(names, engine)
    check_compile(compile)
    if memory and "auto" not in (split_label(m, engine)[0] for m in labels):
        raise SpecdecError("--memory is an option of auto only (its memory of earlier outputs); drop it, or add "
                           "auto to --methods")
    check_options([n for n in (split_label(m, engine)[0] for m in labels) if n not in OUTSIDE_BASELINES] or ["ar"],
                  options)
    if memory:
        from ..drafting.output_memory import check_folder

        check_folder(memory)
    return labels


def bench_vllm_settings(labels: list[str], engine: str, flags_given: tuple, options: dict, datastore) -> dict:
    """vLLM's settings when the run holds a vLLM method (``{}`` otherwise, with the vLLM flags refused)."""
    from ..bench.labels import engine_of
    from .on_vllm import PROPOSER_OPTIONS, vllm_settings

    on_vllm = any(engine_of(m, engine) == "vllm" for m in labels)
    stores = [s.split("=", 1)[1] for s in datastore or [] if s.startswith("auto=")]  # auto's, as datastore_for
    return vllm_settings("vllm" if on_vllm else "specdec", *flags_given,
                         {k: v for k, v in options.items() if k in PROPOSER_OPTIONS}, stores)


def check_stores(lib, cfg) -> dict:
    """Every method's --datastore: present, of its kind, sound, and of the model's tokenizer (the tokenizer alone,
    before the weights load). Each store is opened once; the opened stores are returned, to be shared by the
    methods."""
    from ..methods import precheck_datastore

    from ..bench.labels import split_label

    opened = {}
    for name in (split_label(m, cfg.engine)[0] for m in cfg.methods):
        precheck_datastore(name, lib.datastore_for(name, cfg.datastore), opened)
    if opened:  # the stores a method reads (a bare --datastore beside methods that take none is not opened)
        from ..datastore import check_stores_tokenizer

        check_stores_tokenizer(sorted(opened), cfg.model)
    return opened


def run_bench(lib, cfg, out, resume: bool, compare_to, tolerance: float, plot, as_json: bool) -> None:
    from .. import api
    from ..bench.checkpoint import Checkpoint
    from ..errors import Interrupted
    from ..runtime.machine import set_threads
    from .common import quiet_libraries

    set_threads(cfg.settings.threads)
    lib.datastore_for("rest", cfg.datastore)  # ambiguous --datastore values fail before anything loads
    opened = check_stores(lib, cfg)
    # every file the run reads or writes at its end is checked now: a bad one never costs a finished run
    old_records = lib.read_records(compare_to) if compare_to else None
    if plot:
        lib.check_plot_path(plot)
    if out:
        lib.check_out_file(out)
    checkpoint = Checkpoint(out, cfg.to_json(), resume)  # locks OUT.partial: a second run on --out is refused
    quiet_libraries()
    prompt_list = lib.load_prompts(cfg.prompts, cfg.limit, cfg.category, cfg.offset)  # before the model loads
    target, drafts = load_models(api, cfg)
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
