"""Compare the per-prompt counts of two sets of `specdec bench` records (e.g. before and after a refactor).

    python scripts/compare_counts.py BEFORE_PREFIX AFTER_PREFIX    # every BEFORE_PREFIX*.jsonl against its twin

Prints one line per file and method (prompts compared, identical or the first difference) and exits 1 on any
difference.
"""

from __future__ import annotations

import glob
import json
import os
import sys

KEYS = ("forwards", "emitted", "drafted", "accepted")


def counts(path: str) -> dict[str, list[tuple]]:
    by_method: dict[str, list[tuple]] = {}
    with open(path) as f:
        for line in f:
            record = json.loads(line)
            for result in record.get("results", []):
                rows = by_method.setdefault(result["method"], [])
                rows += [(p["prompt_id"], p["turn"], *(p[k] for k in KEYS)) for p in result["per_prompt"]]
            for result in record.get("rows", []):  # a throughput record (--batch-size): per method and size
                if "per_prompt" in result:
                    rows = by_method.setdefault(f"{result['method']} B={result['batch_size']}", [])
                    rows += [(p["prompt"], *(p[k] for k in KEYS)) for p in result["per_prompt"]]
    return by_method


def main(before: str, after: str) -> int:
    failed = 0
    for path in sorted(glob.glob(before + "*.jsonl")):
        twin = after + path[len(before):]
        if not os.path.exists(twin):
            print(f"{path[len(before):]:28} MISSING: {twin}")
            failed += 1
            continue
        old, new = counts(path), counts(twin)
        for method in sorted(set(old) | set(new)):
            a, b = old.get(method, []), new.get(method, [])
            same = a == b
            failed += not same
            detail = f"{len(a)} prompts identical" if same else f"DIFFER: {next((x, y) for x, y in zip(a + [None] * len(b), b + [None] * len(a)) if x != y)}"
            print(f"{path[len(before):]:28} {method:12} {detail}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
