"""``specdec bench --batch-size B[,B...]``: the throughput mode (docs/bench.md, docs/batching.md).

On the first turn of every prompt, in one process: sequential ``ar`` (the reference outputs and the baseline),
then for each batch size transformers' batched greedy ``generate`` (left padding, chunks of B prompts in input
order: ``hf-batch``) and each of our methods batched (``api.run_batch``). Each run reports total tokens/s,
per-sequence latency (median, p90), speedups against sequential ``ar`` and against ``hf-batch`` (same B, and its
best B), target forwards, outputs identical to ``ar``'s, and the peak resident memory of that run.
"""

from __future__ import annotations

import datetime as _dt
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from .. import api
from ..config import BatchSizes
from ..errors import SpecdecError
from ..io.jsonl import MAX_JSONL_BYTES, iter_jsonl
from ..runtime.machine import set_threads
from .baselines import OUTSIDE_BASELINES
from .config import WARMUP_TOKENS
from .records import git_commit, machine_info
from .hf import ForwardCounter, hf_kwargs
from .runners import cut_at_stop, encode_turn

SCHEMA = "specdec-bench-throughput/2"  # /2: the config holds the run's settings as one object (as bench's)
READ_SCHEMAS = ("specdec-bench-throughput/1", SCHEMA)  # an --out of /1 records is appended to


def check_methods(methods: list[str], engine: str = "specdec") -> list[str]:
    """The methods to run batched, as labels (``ar`` runs sequentially as the baseline, and batched when asked
    for; vLLM's methods run on vLLM at each batch size)."""
    from .labels import label_of, split_label

    refused = [m for m in methods if split_label(m, engine)[0] in OUTSIDE_BASELINES]
    if refused:
        raise SpecdecError(f"--batch-size runs transformers' batched generate itself (hf-batch) and no llama.cpp; drop "
                           f"{', '.join(refused)} from --methods")
    return list(dict.fromkeys(label_of(*split_label(m, engine), engine) for m in methods))


def check_out(path: str) -> None:
    """``--out`` in throughput mode: absent, or a file of throughput records (appended to)."""
    target = Path(path)
    if target.is_dir():
        raise SpecdecError(f"--out {path} is a directory")
    if target.exists() and target.stat().st_size:
        for n, value in enumerate(iter_jsonl(path, "--out", objects=False, limit=MAX_JSONL_BYTES), 1):  # bounded
            if not isinstance(value, dict) or value.get("schema") not in READ_SCHEMAS:
                raise SpecdecError(f"--out {path}: record {n} is not a throughput record ({SCHEMA}); "
                                   "give a new file")


def reset_peak() -> None:
    """Start a new peak-RSS measurement (Linux: ``clear_refs`` 5 resets VmHWM)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def peak_mib() -> float | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def row(method: str, batch: int | str, outputs: list[list[int]], seconds: float, latencies: list[float],
        forwards: int, reference: list[list[int]] | None, peak: float | None) -> dict:
    tokens = sum(len(o) for o in outputs)
    return {"method": method, "batch_size": batch, "new_tokens": tokens, "seconds": seconds,
            "tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
            "latency_median_s": float(np.median(latencies)), "latency_p90_s": float(np.percentile(latencies, 90)),
            "target_forwards": forwards,
            "identical": None if reference is None else sum(a == b for a, b in zip(outputs, reference)),
            "peak_rss_mib": peak}


def sequential_ar(target, ids: list[list[int]], settings, greedy: bool, compile: str = "auto"
                  ) -> tuple[dict, list[list[int]]]:
    drafter = api.make_drafter("ar", target, [], settings, compile=compile)  # the path a batch of one row takes
    api.run(target, ids[0], drafter, settings, max_new_tokens=WARMUP_TOKENS)
    reset_peak()
    t0 = time.perf_counter()
    results = [api.run(target, x, drafter, settings) for x in ids]
    seconds = time.perf_counter() - t0
    outputs = [r.tokens for r in results]
    return row("ar", "sequential", outputs, seconds, [r.total_s for r in results],
               sum(len(r.steps) for r in results), outputs if greedy else None, peak_mib()), outputs


def hf_batched(target, ids: list[list[int]], size: int, max_new_tokens: int,
               cfg) -> tuple[list[list[int]], list, int]:
    """transformers' greedy ``generate`` on chunks of ``size`` prompts, left-padded (the latency mode's ``hf``
    arguments); per-sequence latency = its chunk's time."""
    kwargs = hf_kwargs("hf", target, [], cfg)
    pad = kwargs["pad_token_id"]
    model, outputs, latencies = target.model, [], []
    counter = ForwardCounter(model)
    try:
        for k in range(0, len(ids), size):
            chunk = ids[k: k + size]
            width = max(map(len, chunk))
            inputs = torch.tensor([[pad] * (width - len(x)) + x for x in chunk], device=model.device)
            mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in chunk], device=model.device)
            t0 = time.perf_counter()
            with torch.inference_mode():
                out = model.generate(inputs, attention_mask=mask, max_new_tokens=max_new_tokens, **kwargs)
            latencies += [time.perf_counter() - t0] * len(chunk)
            outputs += [cut_at_stop([int(t) for t in out[j, width:].tolist()], target.stop_ids)
                        for j in range(len(chunk))]
    finally:
        counter.close()
    return outputs, latencies, counter.calls


def timed_hf(target, ids, size, cfg, reference) -> dict:
    hf_batched(target, ids[:size], size, WARMUP_TOKENS, cfg)
    reset_peak()
    t0 = time.perf_counter()
    outputs, latencies, forwards = hf_batched(target, ids, size, cfg.settings.max_new_tokens, cfg)
    seconds = time.perf_counter() - t0
    return row("hf-batch", size, outputs, seconds, latencies, forwards, reference if cfg.greedy else None, peak_mib())


def timed_ours(method: str, target, drafts, ids, size: int, cfg, reference, opened) -> dict:
    from .runners import datastore_for

    settings = replace(cfg.settings, batch_size=size)
    drafters = api.make_drafters(method, target, drafts, settings, check=False, compile=cfg.compile,
                                 datastore=datastore_for(method, cfg.datastore), options=cfg.options, opened=opened)
    learnt = drafters.state()
    api.run_batch(target, ids[:size], drafters, settings, max_new_tokens=WARMUP_TOKENS)  # warm-up (+ timing)
    drafters.load_state(learnt)  # forget what it taught: its answers are the first 8 tokens of every timed row,
    # which auto's memory would hand back
    steps = []
    reset_peak()
    t0 = time.perf_counter()
    results = api.run_batch(target, ids, drafters, settings, on_step=lambda rows, s: steps.append(s))
    seconds = time.perf_counter() - t0
    drafters.finish()
    out = row(method, size, [r.tokens for r in results], seconds, [r.extra["latency_s"] for r in results],
              len(steps), reference if cfg.greedy else None, peak_mib())
    out["per_prompt"] = [counts(i, r.steps) for i, r in enumerate(results)]
    return out


def counts(index: int, steps) -> dict:
    """A sequence's counts, as a sequential record's ``per_prompt`` entry holds them (scripts/compare_counts.py):
    its forwards (each a row of a batched one), emitted, drafted and accepted tokens."""
    return {"prompt": index, "forwards": len(steps), "emitted": sum(s.new_tokens for s in steps),
            "drafted": sum(s.drafted for s in steps), "accepted": sum(s.accepted for s in steps)}


def timed_vllm(label: str, engine, ids, size, cfg, reference) -> dict:
    """vLLM with at most ``size`` sequences at once (continuous batching, our feeder): warm-up, then the run.
    Peak memory is vLLM's processes' resident memory after the run (they are not this process)."""
    from .engines import proposer_delta, vllm_rss_mib

    engine.mark()
    engine.generate(ids[:size], WARMUP_TOKENS, cfg.settings.sampling, batch=size)
    engine.mark(back=True)  # auto's proposer forgets the warm-up: its answers start every timed row
    engine.reset_prefix_cache()
    proposer_delta(engine)
    t0 = time.perf_counter()
    results = engine.generate(ids, cfg.settings.max_new_tokens, cfg.settings.sampling, batch=size)
    seconds = time.perf_counter() - t0
    out = row(label, size, [r.tokens for r in results], seconds, [r.latency_s for r in results], engine.steps,
              reference if cfg.greedy else None, vllm_rss_mib(engine))
    stats = proposer_delta(engine)
    out["engine"] = "vllm"
    if stats is not None:
        out["proposer"] = {k: stats[k] for k in ("propose_ms_per_call", "propose_ms_per_row", "verified", "accepted",
                                                  "sources", "step_cost")}
    return out


def add_speedups(rows: list[dict]) -> None:
    base = next(r["tokens_per_s"] for r in rows if r["batch_size"] == "sequential")
    hf = {r["batch_size"]: r["tokens_per_s"] for r in rows if r["method"] == "hf-batch"}
    plain = {r["batch_size"]: r["tokens_per_s"] for r in rows if r["method"] == "vllm"}
    best = max(hf.values(), default=None)
    for r in rows:
        r["speedup_vs_ar"] = r["tokens_per_s"] / base if base else None
        same = hf.get(r["batch_size"])
        r["speedup_vs_hf_same_b"] = r["tokens_per_s"] / same if same else None
        r["speedup_vs_hf_best"] = r["tokens_per_s"] / best if best else None
        if plain:
            same = plain.get(r["batch_size"])
            r["speedup_vs_vllm_same_b"] = r["tokens_per_s"] / same if same else None
    if hf:
        for r in rows:
            r["hf_best_batch_size"] = max(hf, key=hf.get)


def throughput(cfg, target, drafts, prompts, sizes: BatchSizes, opened: dict | None = None, log=None) -> dict:
    """Run the throughput mode at each of ``sizes`` (at most one slot per prompt); returns its record."""
    set_threads(cfg.settings.threads)
    git_commit()  # the code this run loaded: asked now, kept for the record
    log = log or (lambda text: (sys.stderr.write(f"bench: {text}\n"), sys.stderr.flush()))
    from .labels import split_label
    from .engines import start_engine, vllm_options

    ids = [encode_turn(target, p, 0, [], cfg.settings.max_new_tokens) for p in prompts]
    sizes = list(sizes.fitted(len(ids)))
    first, reference = sequential_ar(target, ids, cfg.settings, cfg.greedy, cfg.compile)
    rows = [first]
    log(f"ar sequential: {first['tokens_per_s']:.1f} tok/s")
    split = {label: split_label(label, cfg.engine) for label in cfg.methods}  # label -> (method, engine)
    for size in sizes:
        if cfg.greedy:
            rows.append(timed_hf(target, ids, size, cfg, reference))
            log(f"hf-batch B={size}: {rows[-1]['tokens_per_s']:.1f} tok/s")
        for label in [m for m in cfg.methods if split[m][1] != "vllm"]:
            rows.append(timed_ours(split[label][0], target, drafts, ids, size, cfg, reference, opened))
            rows[-1]["method"] = label
            log(f"{label} B={size}: {rows[-1]['tokens_per_s']:.1f} tok/s")
    # one vLLM engine alive at a time, and none beside our runs: an idle engine's processes take ~7% of a core,
    # and three alive slowed our 2-thread batched ar at B = 32 from ~188 to 137 tok/s (docs/vllm.md)
    kv_tokens = max(sizes) * (max(map(len, ids)) + cfg.settings.max_new_tokens + 33)
    for label in [m for m in cfg.methods if split[m][1] == "vllm"]:
        engine = start_engine(split[label][0], target, vllm_options(cfg, max(sizes), kv_tokens))
        try:
            for size in sizes:
                rows.append(timed_vllm(label, engine, ids, size, cfg, reference))
                rows[-1]["method"] = label
                log(f"{label} B={size}: {rows[-1]['tokens_per_s']:.1f} tok/s")
            engine.finish()
        finally:
            engine.close()
    order = {label: i for i, label in enumerate(cfg.methods)}  # the table as before: per size, in --methods order
    rows[1:] = sorted(rows[1:], key=lambda r: (r["batch_size"], r["method"] != "hf-batch", order.get(r["method"], -1)))
    add_speedups(rows)
    return {"schema": SCHEMA, "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "machine": machine_info(), "git_commit": git_commit(), "config": cfg.to_json(), "batch_sizes": sizes,
            "prompt_set": cfg.prompts, "num_prompts": len(prompts), "turns": "first", "rows": rows}


def print_table(record: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"throughput: {record['prompt_set']}, {record['num_prompts']} prompts (first turns), "
                        f"{record['config']['settings']['max_new_tokens']} new tokens")
    vllm = any("speedup_vs_vllm_same_b" in r for r in record["rows"])
    cols = ["method", "B", "tok/s", "x ar", "x hf same B", "x hf best", *(["x vllm same B"] if vllm else []),
            "latency p50 s", "p90 s", "forwards", "identical", "peak MiB"]
    for col in cols:
        table.add_column(col, justify="left" if col == "method" else "right")
    fmt = lambda v, f="{:.2f}": "-" if v is None else f.format(v)  # noqa: E731
    for r in record["rows"]:
        table.add_row(r["method"], str(r["batch_size"]), fmt(r["tokens_per_s"], "{:.1f}"), fmt(r["speedup_vs_ar"]),
                      fmt(r["speedup_vs_hf_same_b"]), fmt(r["speedup_vs_hf_best"]),
                      *([fmt(r.get("speedup_vs_vllm_same_b"))] if vllm else []), fmt(r["latency_median_s"]),
                      fmt(r["latency_p90_s"]), str(r["target_forwards"]),
                      "-" if r["identical"] is None else f"{r['identical']}/{record['num_prompts']}",
                      fmt(r["peak_rss_mib"], "{:.0f}"))
    Console(width=160).print(table)
