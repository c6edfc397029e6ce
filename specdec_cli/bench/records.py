"""The JSONL record: machine and git info, merging shards (history and ``--compare``: :mod:`.history`)."""

from __future__ import annotations

import datetime as _dt
import functools
import os
import platform
import subprocess
import sys
from pathlib import Path

import torch

from ..errors import SpecdecError
from ..io.prompts import Prompt
from ..runtime.machine import cpu_name, openmp_waits, peak_rss_bytes
from .config import READ_SCHEMAS, RECORD_SCHEMA, BenchConfig, Generation, upgraded_config
from .engines import BASELINES
from .guard import auto_guard
from .metrics import ratio, summarize_method

# --- the record -------------------------------------------------------------------------------------------------


def gpu_name() -> str | None:
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def package_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def machine_info() -> dict:
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "openmp": openmp_waits(),  # how OpenMP's workers waited: several threads' speed depends on it
        "gpu": gpu_name(),
        "torch": torch.__version__,
        "transformers": package_version("transformers"),
        "specdec": package_version("specdec"),
        "prefill16": prefill16(),
    }


def prefill16() -> dict:
    """The 16-bit prefill strategy this process measured per dtype (``runtime.kernels16.prefill_strategy``: a
    bfloat16 prompt's rows rounded for the CPU's matrix unit, ``native``, or kept float32, ``widen``); empty when
    no 16-bit model ran (then the module need not even be imported). ``--kernels exact`` (the record's config)
    widens whatever was measured."""
    kernels16 = sys.modules.get("specdec_cli.runtime.kernels16")
    measured = kernels16._PREFILL if kernels16 is not None else {}
    threads = torch.get_num_threads()  # the record's torch_threads: the choice its forwards ran
    return {str(dtype).removeprefix("torch."): s for (dtype, n), s in measured.items() if n == threads}


@functools.cache
def git_commit() -> str | None:
    """HEAD of the git checkout holding this package, or None (installed from a wheel, no git, ...). Asked once,
    when a run starts, and kept: a commit made during a long run is not the code the run loaded."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent, capture_output=True,
                             text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    commit = out.stdout.strip()
    return commit if out.returncode == 0 and len(commit) == 40 else None


def memory_setting(cfg: BenchConfig) -> dict | None:
    """Whether ``auto``'s memory of earlier outputs was on, and whether it was kept across runs (``--memory``)."""
    if "auto" not in cfg.methods:
        return None
    on = str(cfg.options.get("memory", "1")) != "0"
    return {"on": on, "across_runs": bool(on and cfg.options.get("memory_dir")), "dir": cfg.options.get("memory_dir")}


def make_record(cfg: BenchConfig, prompts: list[Prompt], results: list[dict], device: str) -> dict:
    return {
        "schema": RECORD_SCHEMA,
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": {**machine_info(), "device": device},
        "peak_rss_mib": round(peak_rss_bytes() / 2**20, 1),  # this process's, models and every method included
        "git_commit": git_commit(),
        "config": cfg.to_json(),
        "prompt_set": cfg.prompts,
        "num_prompts": len(prompts),
        "identity_checked": cfg.greedy,
        "baseline": BASELINES[cfg.engine],  # speedup = tokens/s over this method's, in the same run
        "memory": memory_setting(cfg),
        "note": None if cfg.greedy else "temperature > 0: sampled outputs differ by design; identity check skipped",
        "results": results,
        "auto_guard": auto_guard(results),
    }


# --- merging shards: several runs of one configuration over disjoint prompts ----------------------------------

MERGE_CONFIG_KEYS = ("model", "drafts", "methods", "prompts", "category", "dtype", "device", "datastore", "options",
                     "kernels", "compile", "engine", "vllm")
MERGE_SETTINGS_KEYS = ("max_new_tokens", "sampling", "window", "budget", "threads")  # the seed may differ
MERGE_MACHINE_KEYS = ("cpu", "cpu_count", "gpu", "device", "torch", "transformers")


def generations_of(result: dict) -> list[Generation]:
    """Generations rebuilt from a result's ``per_prompt`` counts (token values are not stored, only how many)."""
    return [Generation(result["method"], p["prompt_id"], p["turn"], [0] * p["new_tokens"], p["seconds"],
                       p.get("forwards"), p.get("emitted"), p.get("drafted"), p.get("accepted"), p.get("draft_s"),
                       prefill_s=p.get("prefill_s"))
            for p in result["per_prompt"]]


def merge_records(records: list[dict]) -> dict:
    """One record for several shards of a run (``--offset``/``--limit``): same configuration and machine, disjoint
    prompts. Every metric is recomputed from the per-generation counts, speedups against the pooled baseline
    (``ar``; ``vllm`` for runs on vLLM)."""
    if len(records) < 2:
        raise SpecdecError("bench-merge needs at least two records")
    base_method = records[0].get("baseline", "ar") if isinstance(records[0], dict) else "ar"
    for rec in records:
        results = rec.get("results") if isinstance(rec, dict) else None
        if not results or rec.get("schema") not in READ_SCHEMAS or not all("per_prompt" in r for r in results) \
                or not any(r.get("method") == base_method for r in results):
            raise SpecdecError(f"not a {RECORD_SCHEMA} record with a {base_method} result: {str(rec)[:60]}...")
    base, configs = records[0], [upgraded_config(rec["config"]) for rec in records]  # /1 and /2 shards alike
    for rec, config in zip(records[1:], configs[1:]):
        diff = [k for k in MERGE_CONFIG_KEYS if config.get(k) != configs[0].get(k)]
        diff += [k for k in MERGE_SETTINGS_KEYS if config["settings"].get(k) != configs[0]["settings"].get(k)]
        diff += [f"machine {k}" for k in MERGE_MACHINE_KEYS if rec["machine"].get(k) != base["machine"].get(k)]
        if diff:
            raise SpecdecError(f"cannot merge records that differ in {', '.join(diff)}")
    methods = base["config"]["methods"]
    seen: set[tuple[str, int]] = set()
    for rec in records:
        ref = next(r for r in rec["results"] if r["method"] == base_method)
        keys = {(p["prompt_id"], p["turn"]) for p in ref["per_prompt"]}
        if keys & seen:
            raise SpecdecError(f"records overlap in prompts, e.g. {sorted(keys & seen)[0][0]}; merge disjoint shards")
        seen |= keys
    rows = {m: [r for rec in records for r in rec["results"] if r["method"] == m] for m in methods}
    base_gens = [g for row in rows[base_method] for g in generations_of(row)]
    base_tps = ratio(sum(len(g.tokens) for g in base_gens), sum(g.seconds for g in base_gens))
    results = []
    for method in methods:
        merged = summarize_method(method, [g for row in rows[method] for g in generations_of(row)], base_tps, None)
        if rows[method][0].get("engine"):
            merged["engine"] = rows[method][0]["engine"]
        checked = [row for row in rows[method] if row.get("lossless") is not None]
        if checked and len(checked) == len(rows[method]):
            merged.update(lossless=all(row["lossless"] for row in checked),
                          identical=sum(row["identical"] for row in checked),
                          mismatches=[m for row in checked for m in row["mismatches"]])
        results.append(merged)
    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    return {**base, "schema": RECORD_SCHEMA, "timestamp": now,
            "config": {**configs[0], "offset": None, "limit": None},
            "num_prompts": sum(rec["num_prompts"] for rec in records), "results": results,
            "auto_guard": auto_guard(results),
            "merged_from": [{"timestamp": rec["timestamp"], "offset": rec["config"].get("offset"),
                             "limit": rec["config"].get("limit"), "git_commit": rec.get("git_commit")}
                            for rec in records]}
