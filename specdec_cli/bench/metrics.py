"""Metrics of a method over a prompt set, from per-generation counts (definitions in docs/bench.md)."""

from __future__ import annotations

from ..engine import metrics
from ..engine.metrics import ratio
from .config import Generation

# --- metrics ----------------------------------------------------------------------------------------------------


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token (the shorter length when one is a prefix of the other); None if equal."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def total(gens: list[Generation], attr: str) -> float | None:
    """Sum of ``attr`` over generations; None when any generation cannot report it."""
    values = [getattr(g, attr) for g in gens]
    return None if any(v is None for v in values) else sum(values)


def identity_check(gens: list[Generation], reference: dict[tuple[str, int], list[int]]) -> dict:
    mismatches = []
    for g in gens:
        div = first_divergence(g.tokens, reference[(g.prompt_id, g.turn)])
        if div is not None:
            mismatches.append({"prompt_id": g.prompt_id, "turn": g.turn, "first_divergence": div})
    return {"lossless": not mismatches, "identical": len(gens) - len(mismatches), "mismatches": mismatches}


def per_prompt_entry(g: Generation) -> dict:
    """One generation's raw counts: enough to re-aggregate records of several runs (``merge_records``)."""
    return {"prompt_id": g.prompt_id, "turn": g.turn, "new_tokens": len(g.tokens), "seconds": round(g.seconds, 6),
            "forwards": g.forwards, "emitted": g.emitted, "drafted": g.drafted, "accepted": g.accepted,
            "draft_s": None if g.draft_s is None else round(g.draft_s, 6),
            "prefill_s": None if g.prefill_s is None else round(g.prefill_s, 6),
            **({"sources": g.sources} if g.sources is not None else {})}


def source_totals(gens: list[Generation]) -> dict | None:
    """Per draft source (``auto``), its counts summed over the generations, with accepted tokens per step."""
    if all(g.sources is None for g in gens):
        return None
    out: dict[str, dict] = {}
    for g in gens:
        for name, row in (g.sources or {}).items():
            acc = out.setdefault(name, {})
            for key, value in row.items():
                acc[key] = acc.get(key, 0) + value
    for row in out.values():
        steps = row.get("steps") or 0
        row["draft_ms_per_step"] = round(1000 * row.get("draft_s", 0.0) / steps, 4) if steps else None
    return out


def decode_rate(gens: list[Generation]) -> float | None:
    """Tokens/s of decoding alone (the prompt's evaluation left out), where every generation reports it: tokens
    after the first over the time after it for llama.cpp, whose prompt evaluation yields the first token; every
    token over the time after the prefill for ours, whose prefill computes no logits."""
    if not gens or any(g.prefill_s is None for g in gens):
        return None
    first = 1 if gens[0].method.startswith("llama-cpp") else 0
    return ratio(sum(len(g.tokens) - first for g in gens), sum(g.seconds - g.prefill_s for g in gens))


def summarize_method(method: str, gens: list[Generation], ar_tokens_per_s: float | None,
                     reference: dict | None) -> dict:
    """Aggregate metrics of one method over the prompt set (definitions in docs/bench.md)."""
    tokens = sum(len(g.tokens) for g in gens)
    seconds = sum(g.seconds for g in gens)
    forwards, emitted = total(gens, "forwards"), total(gens, "emitted")
    drafted, accepted, draft_s = total(gens, "drafted"), total(gens, "accepted"), total(gens, "draft_s")
    tokens_per_s = ratio(tokens, seconds) or 0.0
    row = {
        "method": method,
        "generations": len(gens),
        "new_tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens_per_s,
        "mean_token_ms": 1000 * seconds / tokens if tokens else None,
        "decode_tokens_per_s": decode_rate(gens),
        "speedup": ratio(tokens_per_s, ar_tokens_per_s),
        "mean_accepted_length": metrics.mean_accepted_length(emitted, forwards),
        "sigma": metrics.sigma(accepted, drafted),
        "eta": metrics.eta(forwards, emitted),
        "draft_ms_per_step": 1000 * draft_s / forwards if draft_s is not None and forwards else None,
        "lossless": None,
        "identical": None,
        "mismatches": [],
        "per_prompt": [per_prompt_entry(g) for g in gens],
    }
    sources = source_totals(gens)
    if sources is not None:
        row["sources"] = sources
    if reference is not None:
        row.update(identity_check(gens, reference))
    return row


REFERENCES = ("ar", "vllm")  # plain decoding on either engine: every method's output is checked against each


def summarize(generations: list[Generation], methods: list[str], greedy: bool, baseline: str = "ar") -> list[dict]:
    """Every method's metrics; ``speedup`` and the identity check against ``baseline`` (``ar``, or ``vllm`` on
    vLLM), and against the other plain decoding of the run too when it holds both (``speedup_vs_ar``,
    ``identical_to_vllm``, ...)."""
    by_method = {m: [g for g in generations if g.method == m] for m in methods}
    rate = {m: ratio(sum(len(g.tokens) for g in by_method[m]), sum(g.seconds for g in by_method[m]))
            for m in REFERENCES if m in by_method}
    tokens = {m: {(g.prompt_id, g.turn): g.tokens for g in by_method[m]} for m in rate} if greedy else {}
    rows = [summarize_method(m, by_method[m], rate[baseline], tokens.get(baseline)) for m in methods]
    for row in rows:
        for ref in rate:
            if ref == baseline:
                continue
            row[f"speedup_vs_{ref}"] = ratio(row["tokens_per_s"], rate[ref])
            if greedy:
                row[f"identical_to_{ref}"] = identity_check(by_method[row["method"]], tokens[ref])["identical"]
    return rows


