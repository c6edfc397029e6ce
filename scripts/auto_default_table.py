"""The `auto` issue's table (issue 20; docs/benchmarks.md, "`auto`, the default") from the records of
`bash scripts/bench_auto.sh MODEL STORES OUT_PREFIX`: per set, `auto` with every source against the best single
method of the same run, `auto` with no flags, transformers' baselines and `auto`'s accepted/verified per source;
then the geometric means over the sets.

    python scripts/auto_default_table.py OUT_PREFIX      (e.g. docs/results/auto-default-after-tiles/cpu-smollm2-135m)
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from auto_unseen_table import last_record

SETS = ("humaneval", "long-edit", "rag", "mt-bench")
SINGLES = ("pld", "ngram-trie", "rest", "aded", "sd")
HF = ("hf", "hf-pld")
HEADER = ("| set | auto, every source (acc. len) | best single method | auto / best | auto, no flags (acc. len) | "
          "transformers | accepted/verified by source (g = gated steps) | identical to ar |\n"
          "|---|---|---|---|---|---|---|---|")


def sources_text(sources: dict | None) -> str:
    return ", ".join(f"{name} {row['accepted']}/{row['verified']}"
                     + (f" g{row['gated_steps']}" if row.get("gated_steps") else "")
                     for name, row in (sources or {}).items())


def set_row(name: str, full: dict, bare: dict, speeds: dict[str, list[float]]) -> str:
    """The table's line for one set; appends each method's speedup to ``speeds`` (``bare``: auto with no flags)."""
    res = {r["method"]: r for r in full["results"]}
    plain = {r["method"]: r for r in bare["results"]}["auto"]
    best = max(SINGLES, key=lambda m: res[m]["speedup"] if m in res else 0)
    auto = res["auto"]
    for method in ("auto", *SINGLES):
        speeds.setdefault(method, []).append(res[method]["speedup"])
    speeds.setdefault("bare", []).append(plain["speedup"])
    hf = " ".join(f"{m} {res[m]['speedup']:.2f}" for m in HF if m in res)
    same = all(r.get("lossless", True) for r in full["results"] + bare["results"])
    return (f"| {name} | **{auto['speedup']:.2f}** ({auto['mean_accepted_length']:.2f}) | {best} "
            f"{res[best]['speedup']:.2f} ({res[best]['mean_accepted_length']:.2f}) | "
            f"{auto['speedup'] / res[best]['speedup']:.2f} | "
            f"{plain['speedup']:.2f} ({plain['mean_accepted_length']:.2f}) | {hf} | {sources_text(auto.get('sources'))} | "
            f"{'yes' if same else 'NO'} |")


def main(prefix: str) -> None:
    print(HEADER)
    speeds: dict[str, list[float]] = {}
    for name in SETS:
        full, bare = last_record(Path(f"{prefix}-{name}.jsonl")), last_record(Path(f"{prefix}-{name}-bare.jsonl"))
        if full and bare:
            print(set_row(name, full, bare, speeds))
    if not speeds:
        return
    geo = {m: math.exp(sum(map(math.log, v)) / len(v)) for m, v in speeds.items()}
    best = max(SINGLES, key=lambda m: geo[m])
    print()
    print(f"geometric means over {len(speeds['auto'])} sets: auto {geo['auto']:.2f}, auto no flags {geo['bare']:.2f}; "
          "singles " + ", ".join(f"{m} {geo[m]:.2f}" for m in SINGLES)
          + f"; auto / best single ({best}) = {geo['auto'] / geo[best]:.2f}")


if __name__ == "__main__":
    main(sys.argv[1])
