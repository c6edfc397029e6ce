"""Markdown summary of `specdec bench --out` records: one table per model, speedup vs `ar` per prompt set.

    python scripts/results_markdown.py docs/results/methods-vs-transformers/*.jsonl

Each file contributes its last record; files whose name ends in ``-rerun.jsonl`` override the methods they ran
(a rerun is a full record of its own: its `ar` ran in the same process; later reruns win). Cells: speedup (mean accepted length);
`!` marks outputs that differ from `ar` (never expected).
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path


def last_record(path: Path) -> dict:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()][-1]


def main(paths: list[str]) -> None:
    cells: dict[str, dict[str, dict[str, str]]] = defaultdict(lambda: defaultdict(dict))
    extras: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    records = {path: last_record(path) for path in map(Path, paths)}
    for path in sorted(records, key=lambda p: (p.name.endswith("-rerun.jsonl"), records[p]["timestamp"])):
        record = records[path]
        model, prompts = record["config"]["model"], record["config"]["prompts"]
        results = {r["method"]: r for r in record["results"]}
        tag = " (rerun)" if path.name.endswith("-rerun.jsonl") else ""
        for method, r in results.items():
            acc = r.get("mean_accepted_length")
            cell = f"{r['speedup']:.2f}" + (f" ({acc:.2f})" if acc and method != "ar" else "")
            cell += "" if r.get("lossless") is not False else " !"
            cells[model][method][prompts] = cell + (tag if method != "ar" else "")
        tps = {m: r["tokens_per_s"] for m, r in results.items()}
        for ours, theirs in (("ar", "hf"), ("sd", "hf-assisted"), ("pld", "hf-pld")):
            if ours in tps and theirs in tps:
                extras[model][prompts].append(f"{ours}/{theirs} {tps[ours] / tps[theirs]:.2f}{tag}")
        extras[model][prompts].append(f"ar {tps['ar']:.1f} tok/s{tag}")
    for model, rows in cells.items():
        sets = sorted({s for row in rows.values() for s in row})
        print(f"\n**{model}** -- speedup vs `ar` (mean accepted length)\n")
        print("| method | " + " | ".join(sets) + " |")
        print("|---|" + "---|" * len(sets))
        for method, row in rows.items():
            print(f"| {method} | " + " | ".join(row.get(s, "-") for s in sets) + " |")
        print("| *ours vs transformers* | " + " | ".join("; ".join(extras[model][s]) for s in sets) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
