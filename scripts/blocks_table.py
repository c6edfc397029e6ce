"""The table of scripts/bench_blocks.sh's records (issue 35's GGUF stretch): per set, the `--kernels blocks` run and
the float32 run, each with llama.cpp reading the shipped file (`llama-cpp-stored`) in the same run; the ratio
blocks / float32 goes through that common anchor.

    python scripts/blocks_table.py docs/results/gguf-blocks/cpu-smollm2-135m
"""
import json
import sys

prefix = sys.argv[1]
print("| set | `ar` blocks decode tok/s | llama.cpp stored decode | ratio | `ar` blocks end to end | `auto` blocks | "
      "llama.cpp stored | `auto` / llama.cpp stored | llama.cpp F32 | `ar` float32 | `auto` float32 | llama.cpp stored "
      "(float32 run) | `ar` blocks / float32 | `auto` blocks / float32 | identical to `ar` |")
print("|" + "---|" * 15)
for s in ("humaneval", "mt-bench", "rag", "long-edit"):
    try:
        b = json.loads(open(f"{prefix}-{s}-blocks.jsonl").readline())
        f = json.loads(open(f"{prefix}-{s}-float32.jsonl").readline())
    except FileNotFoundError:
        continue
    B = {r["method"]: r for r in b["results"]}; F = {r["method"]: r for r in f["results"]}
    lb, lf = B["llama-cpp-stored"], F["llama-cpp-stored"]
    def ident(r): return f"{r['identical']}/{r['generations']}"
    print(f"| {s} | {B['ar']['decode_tokens_per_s']:.1f} | {lb['decode_tokens_per_s']:.1f} | {B['ar']['decode_tokens_per_s']/lb['decode_tokens_per_s']:.2f} "
          f"| {B['ar']['tokens_per_s']:.1f} | {B['auto']['tokens_per_s']:.1f} | {lb['tokens_per_s']:.1f} | {B['auto']['tokens_per_s']/lb['tokens_per_s']:.2f} "
          f"| {B['llama-cpp']['tokens_per_s']:.1f} "
          f"| {F['ar']['tokens_per_s']:.1f} | {F['auto']['tokens_per_s']:.1f} | {lf['tokens_per_s']:.1f} "
          f"| {(B['ar']['tokens_per_s']/lb['tokens_per_s'])/(F['ar']['tokens_per_s']/lf['tokens_per_s']):.2f} "
          f"| {(B['auto']['tokens_per_s']/lb['tokens_per_s'])/(F['auto']['tokens_per_s']/lf['tokens_per_s']):.2f} "
          f"| ar {ident(B['ar'])}, auto {ident(B['auto'])}; stored {ident(lb)}, F32 {ident(B['llama-cpp'])} |")
