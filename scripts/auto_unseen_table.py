"""`auto` on prompts it was not tuned on (issue 36): tables from the records of
`bash scripts/bench_auto_unseen.sh MODEL OUT_PREFIX` (the last record of each file): per prompt set, and per
category of the `wide` sets, every method's speedup over `ar` of the same run, `auto` against the best single
method (with the guard's noise), accepted lengths and `auto`'s per-source counts; then, per model, the geometric
means over the sets and which Done-means targets hold.

    python scripts/auto_unseen_table.py docs/results/auto-unseen/cpu-smollm2-135m \
        docs/results/auto-unseen/cpu-gemma3-270m

A category's figures are recomputed from the per-prompt counts of its prompts (tokens / seconds, `ar` of the same
prompts), so they come from the same interleaved run as the set's.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdec_cli.bench.guard import auto_guard  # noqa: E402

SETS = ("humaneval", "mt-bench", "rag", "long-edit", "wide", "wide-heldout")
GEOMEAN_SETS = ("humaneval", "mt-bench", "rag", "long-edit", "wide")  # the new set's tuning part
SINGLES = ("pld", "ngram-trie")
TARGET_EACH, TARGET_GEOMEAN = 0.97, 1.15


def last_record(path: Path) -> dict | None:
    if not path.exists():
        return None
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    return json.loads(lines[-1]) if lines else None


def restrict(record: dict, category: str) -> list[dict]:
    """The record's results recomputed over one category's prompts (ids `wide/KIND/i`)."""
    out = []
    for r in record["results"]:
        per = [p for p in r["per_prompt"] if p["prompt_id"].split("/")[1] == category]
        tokens, seconds = sum(p["new_tokens"] for p in per), sum(p["seconds"] for p in per)
        forwards, emitted = sum(p["forwards"] or 0 for p in per), sum(p["emitted"] or 0 for p in per)
        sources: dict[str, dict] = {}
        for p in per:
            for name, row in (p.get("sources") or {}).items():
                acc = sources.setdefault(name, {})
                for k, v in row.items():
                    acc[k] = acc.get(k, 0) + v
        out.append({"method": r["method"], "tokens_per_s": tokens / seconds if seconds else 0.0,
                    "mean_accepted_length": emitted / forwards if forwards else None, "per_prompt": per,
                    "sources": sources or None, "lossless": r.get("lossless")})
    ar = next(r for r in out if r["method"] == "ar")["tokens_per_s"]
    for r in out:
        r["speedup"] = r["tokens_per_s"] / ar if ar else None
    return out


def row_text(label: str, results: list[dict]) -> tuple[str, dict]:
    by = {r["method"]: r for r in results}
    guard = auto_guard(results)
    cells = [f"{by['ar']['tokens_per_s']:.1f}"]
    for m in ("auto", *SINGLES):
        r = by.get(m)
        cells.append("" if r is None else f"{r['speedup']:.2f}x ({r['mean_accepted_length'] or 0:.2f})")
    src = ", ".join(f"{n} {v.get('accepted', 0)}/{v.get('verified', 0)}" + (f" g{v['gated_steps']}" if v.get(
        "gated_steps") else "") for n, v in (by["auto"].get("sources") or {}).items())
    same = all(r.get("lossless") is not False for r in results)
    flag = " **TRAILS**" if guard["trails"] else ""
    cells += [f"{guard['ratio']:.3f} ({guard['best']}, noise {guard['noise']:.0%}){flag}", src,
              "yes" if same else "NO"]
    return f"| {label} | " + " | ".join(cells) + " |", guard


def model_table(prefix: str) -> None:
    model = Path(prefix).name
    print(f"\n**{model}** (`{prefix}-*.jsonl`; speedup over `ar` of the same run, accepted length in brackets)\n")
    print("| set | ar tok/s | auto | pld | ngram-trie | auto / best single | auto accepted/verified by source "
          "(g = gated steps) | identical to ar |")
    print("|---|---|---|---|---|---|---|---|")
    speed: dict[str, dict[str, float]] = {}
    worst = math.inf
    for s in SETS:
        record = last_record(Path(f"{prefix}-{s}.jsonl"))
        if record is None:
            continue
        line, guard = row_text(f"{s} ({record['num_prompts']})", record["results"])
        print(line)
        worst = min(worst, guard["ratio"])
        speed[s] = {r["method"]: r["speedup"] for r in record["results"]}
        if s.startswith("wide"):
            for cat in sorted({p["prompt_id"].split("/")[1] for p in record["results"][0]["per_prompt"]}):
                line, guard = row_text(f"{s} / {cat}", restrict(record, cat))
                print(line)
                worst = min(worst, guard["ratio"])
    summary(speed, worst)


def summary(speed: dict[str, dict[str, float]], worst: float) -> None:
    sets = [s for s in GEOMEAN_SETS if s in speed]
    if not sets:
        return
    geo = {m: math.exp(sum(math.log(speed[s][m]) for s in sets) / len(sets)) for m in ("auto", *SINGLES)}
    best = max(SINGLES, key=lambda m: geo[m])
    ratio = geo["auto"] / geo[best]
    print(f"\ngeometric means over {', '.join(sets)}: " + ", ".join(f"{m} {g:.2f}" for m, g in geo.items())
          + f"; auto / best single ({best}) = **{ratio:.3f}** (target >= {TARGET_GEOMEAN}: "
          f"{'met' if ratio >= TARGET_GEOMEAN else 'NOT met'}); lowest auto / best of any set or category: "
          f"**{worst:.3f}** (target >= {TARGET_EACH}: {'met' if worst >= TARGET_EACH else 'NOT met'})")


def main() -> None:
    for prefix in sys.argv[1:] or [f"docs/results/auto-unseen/cpu-{m}" for m in ("smollm2-135m", "gemma3-270m")]:
        model_table(prefix)


if __name__ == "__main__":
    main()
