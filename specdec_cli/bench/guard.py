"""The guard on ``auto``: does the default method end a run below the best single method it ran beside?

``auto`` merges every draft source so that it should never trail any one of them. When it does, by more than the
run's own noise, a record says so -- with the counts that explain it (accepted length, and per draft source the
nodes verified, accepted and accepted by it alone, and the steps its gate skipped).

Noise comes from the run itself: methods run interleaved per prompt, so the per-prompt ratios ``r_i`` =
``auto``'s tokens/s on prompt ``i`` over the best method's on the same prompt (all turns) are paired measurements.
The noise is two standard errors of their mean log (about a 95% interval), and never less than
:data:`NOISE_FLOOR`: ``auto`` *trails* when its aggregate tokens/s is below the best method's by more than that.
"""

from __future__ import annotations

import math

AUTO = "auto"
PLAIN = ("ar", "vllm")  # plain decoding on either engine: the baseline, not a drafter auto must match
NOISE_FLOOR = 0.02  # two interleaved timings of one generation on a quiet CPU differ by ~1-2%
Z = 2.0  # standard errors: about a 95% interval


def per_prompt_rates(result: dict) -> dict[str, float]:
    """Tokens per second of each prompt (all its turns) of a method's result."""
    tokens: dict[str, float] = {}
    seconds: dict[str, float] = {}
    for entry in result.get("per_prompt") or []:
        pid = entry["prompt_id"]
        tokens[pid] = tokens.get(pid, 0) + entry["new_tokens"]
        seconds[pid] = seconds.get(pid, 0.0) + entry["seconds"]
    return {pid: tokens[pid] / seconds[pid] for pid in tokens if seconds[pid] > 0 and tokens[pid] > 0}


def noise_of(auto: dict, best: dict) -> tuple[float, int]:
    """(noise as a fraction, prompts compared): two standard errors of the mean log per-prompt ratio."""
    a, b = per_prompt_rates(auto), per_prompt_rates(best)
    logs = [math.log(a[p] / b[p]) for p in a if p in b]
    if len(logs) < 2:
        return NOISE_FLOOR, len(logs)
    mean = sum(logs) / len(logs)
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (len(logs) - 1))
    return max(NOISE_FLOOR, math.expm1(Z * sd / math.sqrt(len(logs)))), len(logs)


def source_counts(result: dict) -> dict:
    """Per draft source: verified, accepted, accepted only by it, gated steps (what explains auto's choices)."""
    return {name: {k: row.get(k, 0) for k in ("verified", "accepted", "accepted_only", "gated_steps")}
            for name, row in (result.get("sources") or {}).items()}


def auto_guard(results: list[dict]) -> dict | None:
    """The guard's finding for a run's results, or None when ``auto`` did not run beside another method."""
    auto = next((r for r in results if r["method"] == AUTO), None)
    others = [r for r in results if r is not auto and r["method"].partition("@")[0] not in PLAIN
              and r.get("engine") == (auto or {}).get("engine") and r.get("tokens_per_s")]  # drafters of its engine
    if auto is None or not others or not auto.get("tokens_per_s"):
        return None
    best = max(others, key=lambda r: r["tokens_per_s"])
    ratio = auto["tokens_per_s"] / best["tokens_per_s"]
    noise, compared = noise_of(auto, best)
    return {"best": best["method"], "ratio": ratio, "noise": noise, "prompts_compared": compared,
            "trails": ratio < 1.0 - noise, "auto_speedup": auto.get("speedup"), "best_speedup": best.get("speedup"),
            "auto_accepted_length": auto.get("mean_accepted_length"),
            "best_accepted_length": best.get("mean_accepted_length"), "sources": source_counts(auto)}


def guard_text(guard: dict | None) -> str | None:
    """One line for the table: always the comparison, and what explains it when auto trails."""
    if guard is None:
        return None
    head = (f"auto / best single method ({guard['best']}): {guard['ratio']:.2f}x (noise +-{guard['noise']:.0%}, "
            f"{guard['prompts_compared']} prompts)")
    if not guard["trails"]:
        return head
    acc = guard["auto_accepted_length"], guard["best_accepted_length"]
    lengths = f"accepted length {acc[0]:.2f} vs {acc[1]:.2f}" if None not in acc else "accepted length n/a"
    parts = [f"{name} {row['accepted']}/{row['verified']} (alone {row['accepted_only']}"
             + (f", gated {row['gated_steps']}" if row["gated_steps"] else "") + ")"
             for name, row in guard["sources"].items()]
    return (f"WARNING {head}: auto TRAILS {guard['best']} by more than noise; {lengths}; accepted/verified by "
            f"source: {', '.join(parts) or 'none'}")
