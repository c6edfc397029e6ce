"""Markdown table of `specdec bench --batch-size` records (docs/benchmarks.md):
    python scripts/throughput_table.py docs/results/throughput/*.jsonl"""

from __future__ import annotations

import json
import sys


def fmt(value, spec="{:.2f}"):
    return "-" if value is None else spec.format(value)


def main(paths: list[str]) -> None:
    print("| model | prompts | run | B | tok/s | x seq. ar | x hf same B | x hf best | latency p50 / p90 s | forwards | "
          "identical | peak RSS MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for path in paths:
        with open(path, encoding="utf-8") as fh:
            record = [json.loads(line) for line in fh if line.strip()][-1]
        model, prompts, n = record["config"]["model"], record["prompt_set"], record["num_prompts"]
        for r in record["rows"]:
            print(f"| {model} | {prompts} ({n}) | {r['method']} | {r['batch_size']} | {r['tokens_per_s']:.1f} | "
                  f"{fmt(r['speedup_vs_ar'])} | {fmt(r['speedup_vs_hf_same_b'])} | {fmt(r['speedup_vs_hf_best'])} | "
                  f"{r['latency_median_s']:.1f} / {r['latency_p90_s']:.1f} | {r['target_forwards']} | "
                  f"{fmt(r['identical'], '{}')}/{n} | {fmt(r['peak_rss_mib'], '{:.0f}')} |")


if __name__ == "__main__":
    main(sys.argv[1:])
