"""`auto` against the single methods after the faster step (issue 25): tok/s of every method per model and prompt
set now (docs/results/auto-vs-methods/cpu-*, from scripts/bench_auto_vs_methods.sh), beside the same method's tok/s
in the `auto` issue's records (docs/results/auto-default/cpu-*: `ar` and `auto` from the no-flags runs, the single
methods and transformers' baselines from the every-source runs).

    python scripts/auto_vs_methods_table.py
"""

from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
MODELS = ("smollm2-135m", "gemma3-270m")
SETS = ("humaneval", "long-edit", "rag", "mt-bench")


def tok_s(path: Path) -> dict[str, tuple[float, bool]]:
    if not path.exists():
        return {}
    record = [json.loads(line) for line in path.read_text().splitlines() if line.strip()][-1]
    return {r["method"]: (r["tokens_per_s"], r.get("lossless") is not False) for r in record["results"]}


def main() -> None:
    for model in MODELS:
        print(f"\n**{model}** (tok/s now, x `ar` of the same run; in brackets the `auto` issue's tok/s)\n")
        rows = []
        methods: list[str] = []
        for s in SETS:
            now = tok_s(RESULTS / "auto-vs-methods" / f"cpu-{model}-{s}.jsonl")
            old = {**tok_s(RESULTS / "auto-default" / f"cpu-{model}-{s}.jsonl"),
                   **{k: v for k, v in tok_s(RESULTS / "auto-default" / f"cpu-{model}-{s}-bare.jsonl").items()}}
            methods += [m for m in now if m not in methods]
            rows.append((s, now, old))
        print("| set | " + " | ".join(methods) + " | identical to ar |")
        print("|---|" + "---|" * (len(methods) + 1))
        for s, now, old in rows:
            ar = now["ar"][0]
            cells = []
            for m in methods:
                if m not in now:
                    cells.append("")
                    continue
                before = f" [{old[m][0]:.1f}]" if m in old else ""
                cells.append(f"{now[m][0]:.1f} ({now[m][0] / ar:.2f}x){before}")
            same = all(ok for ok, in ((v[1],) for v in now.values()))
            print(f"| {s} | " + " | ".join(cells) + f" | {'yes' if same else 'NO'} |")


if __name__ == "__main__":
    main()
