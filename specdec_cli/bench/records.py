"""The JSONL record: machine and git info, merging shards, history and ``--compare``."""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
from dataclasses import asdict
from pathlib import Path

import torch

from ..errors import SpecdecError
from ..io.jsonl import MAX_JSONL_BYTES, iter_jsonl
from ..io.prompts import Prompt
from ..runtime.machine import cpu_name, peak_rss_bytes
from .config import RECORD_SCHEMA, BenchConfig, Generation
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
        "gpu": gpu_name(),
        "torch": torch.__version__,
        "transformers": package_version("transformers"),
        "specdec": package_version("specdec"),
    }


def git_commit() -> str | None:
    """HEAD of the git checkout holding this package, or None (installed from a wheel, no git, ...)."""
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
        "config": asdict(cfg),
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

MERGE_CONFIG_KEYS = ("model", "drafts", "methods", "prompts", "category", "max_new_tokens", "temperature", "dtype",
                     "device", "datastore", "window", "options", "threads", "budget", "kernels",
                     "compile", "engine", "vllm")
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
        if not results or rec.get("schema") != RECORD_SCHEMA or not all("per_prompt" in r for r in results) \
                or not any(r.get("method") == base_method for r in results):
            raise SpecdecError(f"not a {RECORD_SCHEMA} record with a {base_method} result: {str(rec)[:60]}...")
    base = records[0]
    for rec in records[1:]:
        diff = [k for k in MERGE_CONFIG_KEYS if rec["config"].get(k) != base["config"].get(k)]
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
    return {**base, "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "config": {**base["config"], "offset": None, "limit": None},
            "num_prompts": sum(rec["num_prompts"] for rec in records), "results": results,
            "auto_guard": auto_guard(results),
            "merged_from": [{"timestamp": rec["timestamp"], "offset": rec["config"].get("offset"),
                             "limit": rec["config"].get("limit"), "git_commit": rec.get("git_commit")}
                            for rec in records]}


# --- history: --out and --compare --------------------------------------------------------------------------------


def append_record(path: str, record: dict) -> None:
    try:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")
    except OSError as err:
        raise SpecdecError(f"cannot write --out {path}: {err.strerror or err}") from None


def read_records(path: str, what: str = "--compare", merge: bool = False) -> list[dict]:
    """The bench records of a JSONL file, one per line; anything else (another JSON object, a record with a field
    of the wrong type) is a clear error now, before any run: never a traceback after it. ``merge``: also the
    per-generation counts ``bench-merge`` re-aggregates."""
    records = list(iter_jsonl(path, what, limit=MAX_JSONL_BYTES))
    for n, record in enumerate(records, 1):
        problem = record_problem(record, merge)
        if problem:
            raise SpecdecError(f"{what} {path}: record {n} is not a {RECORD_SCHEMA} record ({problem})")
    return records


def _number(value, optional: bool = True) -> bool:
    import math

    if value is None:
        return optional
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _count(value, optional: bool = True) -> bool:
    if value is None:
        return optional
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def record_problem(record, merge: bool = False) -> str | None:
    """What is wrong with a bench record (None: nothing) -- the fields ``--compare``, ``bench-merge`` and the
    report read, with their types."""
    if not isinstance(record, dict) or record.get("schema") != RECORD_SCHEMA:
        return "schema"
    config, results = record.get("config"), record.get("results")
    if not isinstance(config, dict) or not isinstance(config.get("model"), str):
        return "config"
    if not isinstance(record.get("prompt_set"), str):
        return "prompt_set"
    if not isinstance(record.get("machine"), dict):
        return "machine"
    if record.get("baseline") is not None and not isinstance(record.get("baseline"), str):
        return "baseline"
    if not isinstance(results, list):
        return "results"
    for r in results:
        if not isinstance(r, dict) or not isinstance(r.get("method"), str):
            return "results: method"
        for key in ("speedup", "tokens_per_s", "mean_token_ms", "mean_accepted_length", "sigma", "eta",
                    "draft_ms_per_step"):
            if not _number(r.get(key)):
                return f"results: {key}"
        if r.get("lossless") not in (None, True, False):
            return "results: lossless"
        if not merge:
            continue
        mismatches = r.get("mismatches", [])
        if not _count(r.get("identical")) or not isinstance(mismatches, list) or not all(
                isinstance(m, dict) and isinstance(m.get("prompt_id"), str) for m in mismatches):
            return "results: identical"
        per_prompt = r.get("per_prompt")
        if not isinstance(per_prompt, list):
            return "results: per_prompt"
        for entry in per_prompt:
            if not isinstance(entry, dict) or not isinstance(entry.get("prompt_id"), str) \
                    or not _count(entry.get("turn"), False) or not _count(entry.get("new_tokens"), False) \
                    or not _number(entry.get("seconds"), False) \
                    or not all(_count(entry.get(k)) for k in ("forwards", "emitted", "drafted", "accepted")) \
                    or not _number(entry.get("draft_s")):
                return "results: per_prompt entry"
    if merge:
        if not isinstance(config.get("methods"), list) or not all(isinstance(m, str) for m in config["methods"]):
            return "config: methods"
        if not _count(record.get("num_prompts"), False):
            return "num_prompts"
    return None


def check_out_file(path: str, option: str = "--out") -> None:
    """Before a run: ``--out`` is absent (created only when the record is written) or a file of bench records
    that can be appended to. Nothing is created or changed here."""
    import os

    target = Path(path)
    if target.is_dir():
        raise SpecdecError(f"{option} {path} is a directory")
    if target.exists():
        if not target.is_file():
            raise SpecdecError(f"{option} {path} is not a regular file")
        if target.stat().st_size:
            read_records(path, option)
        if not os.access(target, os.W_OK):
            raise SpecdecError(f"cannot write {option} {path}: permission denied")
        return
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        raise SpecdecError(f"cannot write {option} {path}: no such directory {parent}")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise SpecdecError(f"cannot write {option} {path}: permission denied")


def latest_result(records: list[dict], model: str, prompt_set: str, method: str) -> dict | None:
    """The method's result in the newest record (by file order) with the same model and prompt set."""
    for record in reversed(records):
        if record.get("config", {}).get("model") != model or record.get("prompt_set") != prompt_set:
            continue
        for result in record.get("results", []):
            if result.get("method") == method:
                return result
    return None


def compare(record: dict, old_records: list[dict], tolerance: float) -> list[dict]:
    """One finding per method: ``regression`` when the speedup fell by more than ``tolerance`` (a fraction) or the
    greedy output is no longer identical to ``ar``'s; ``ok``; or ``new`` when there is nothing to compare with."""
    findings = []
    model, prompt_set = record["config"]["model"], record["prompt_set"]
    for result in record["results"]:
        old = latest_result(old_records, model, prompt_set, result["method"])
        new_speedup = result.get("speedup")
        old_speedup = old.get("speedup") if old else None
        change = ratio(new_speedup, old_speedup)
        reasons = []
        if result.get("lossless") is False:
            reasons.append("output differs from ar")
        if change is not None and change < 1 - tolerance:
            reasons.append(f"speedup {old_speedup:.2f} -> {new_speedup:.2f} ({(change - 1) * 100:+.0f}%)")
        status = "regression" if reasons else ("new" if old is None else "ok")
        findings.append({"method": result["method"], "old_speedup": old_speedup, "new_speedup": new_speedup,
                         "change": None if change is None else change - 1, "status": status, "reasons": reasons})
    return findings


def has_regression(findings: list[dict]) -> bool:
    return any(f["status"] == "regression" for f in findings)


