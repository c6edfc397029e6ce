"""The table of docs/vllm.md from bench records of scripts/bench_vllm.sh: per model, each method's tokens/s end to
end over all prompts, its speedup against vLLM plain (the run's baseline), and per prompt category (the prompt
set each prompt came from), the same speedup; identical outputs counted.
    python scripts/vllm_table.py RECORDS.jsonl...
"""

from __future__ import annotations

import json
import sys


def rates(result: dict) -> dict[str, tuple[int, float]]:
    """Per category: (new tokens, seconds) over its prompts, every turn."""
    out: dict[str, list] = {}
    for entry in result["per_prompt"]:
        cat = entry["prompt_id"].split("/")[0]
        cell = out.setdefault(cat, [0, 0.0])
        cell[0] += entry["new_tokens"]
        cell[1] += entry["seconds"]
    return {k: (v[0], v[1]) for k, v in out.items()}


def table(record: dict) -> str:
    results = record["results"]
    base = next(r for r in results if r["method"] == record.get("baseline", "vllm"))
    base_rates = rates(base)
    cats = list(base_rates)
    head = ["method", "engine", "tok/s", "x vllm", *(f"x vllm {c}" for c in cats), "accepted length", "identical"]
    settings = record["config"].get("settings", record["config"])  # specdec-bench/2 nests them; /1 kept them flat
    lines = [f"**{record['config']['model']}** ({record['num_prompts']} prompts, {settings['max_new_tokens']}"
             f" new tokens, {record['machine'].get('cpu', '')})", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        own = rates(r)
        per_cat = []
        for c in cats:
            t, s = own.get(c, (0, 0.0))
            bt, bs = base_rates[c]
            per_cat.append(f"{(t / s) / (bt / bs):.2f}x" if s and bs and bt else "-")
        acc = r.get("mean_accepted_length")
        lines.append("| " + " | ".join([r["method"], r.get("engine") or "specdec", f"{r['tokens_per_s']:.1f}",
                                        f"{r['speedup']:.2f}x", *per_cat, f"{acc:.2f}" if acc else "-",
                                        f"{r.get('identical')}/{r.get('generations')}"]) + " |")
    return "\n".join(lines)


def main(paths: list[str]) -> int:
    for path in paths:
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                if line.strip():
                    print(table(json.loads(line)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
