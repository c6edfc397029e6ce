"""Bench history: appending records to ``--out``, reading and checking record files (``--compare``,
``bench-merge``, ``--resume``), and the regression check of ``--compare``."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import SpecdecError
from ..io.jsonl import MAX_JSONL_BYTES, iter_jsonl
from .config import READ_SCHEMAS, RECORD_SCHEMA
from .metrics import ratio


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
    if not isinstance(record, dict) or record.get("schema") not in READ_SCHEMAS:
        return "schema"
    config, results = record.get("config"), record.get("results")
    if not isinstance(config, dict) or not isinstance(config.get("model"), str):
        return "config"
    if record["schema"] == RECORD_SCHEMA and not (isinstance(config.get("settings"), dict)
                                                  and isinstance(config["settings"].get("sampling"), dict)):
        return "config: settings"
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


