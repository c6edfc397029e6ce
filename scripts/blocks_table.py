"""The tables of scripts/bench_blocks.sh's records (issue 35's GGUF stretch).

    python scripts/blocks_table.py docs/results/gguf-blocks/cpu-smollm2-135m
    python scripts/blocks_table.py docs/results/gguf-blocks/cpu-smollm2-135m --run tall

Without --run: per set, the `--kernels blocks` run and the float32 run (`PREFIX-SET-blocks.jsonl`,
`PREFIX-SET-float32.jsonl`), each with llama.cpp reading the shipped file (`llama-cpp-stored`) in the same run; the
ratio blocks / float32 goes through that common anchor.

With --run NAME: the blocks run `PREFIX-SET-blocks-NAME.jsonl` alone (`ar`, `auto`, `pld`, `ngram-trie` and
`llama-cpp-stored`): `ar`'s decode against llama.cpp's, `auto` against llama.cpp end to end and against the best
single method of the run, and the geometric mean of that last ratio over the sets.
"""
import argparse
import json
import math

SETS = ("humaneval", "mt-bench", "rag", "long-edit")


def ident(r):
    return f"{r['identical']}/{r['generations']}"


def rate(run: dict, anchor: dict, method: str) -> float:
    """``method``'s tokens per second over the anchor's (llama.cpp) in the same run."""
    return run[method]["tokens_per_s"] / anchor["tokens_per_s"]


def with_float32(prefix: str) -> None:
    print("| set | `ar` blocks decode tok/s | llama.cpp stored decode | ratio | `ar` blocks end to end | `auto` blocks "
          "| llama.cpp stored | `auto` / llama.cpp stored | llama.cpp F32 | `ar` float32 | `auto` float32 | llama.cpp "
          "stored (float32 run) | `ar` blocks / float32 | `auto` blocks / float32 | identical to `ar` |")
    print("|" + "---|" * 15)
    for s in SETS:
        try:
            b = json.loads(open(f"{prefix}-{s}-blocks.jsonl").readline())
            f = json.loads(open(f"{prefix}-{s}-float32.jsonl").readline())
        except FileNotFoundError:
            continue
        B = {r["method"]: r for r in b["results"]}
        F = {r["method"]: r for r in f["results"]}
        lb, lf = B["llama-cpp-stored"], F["llama-cpp-stored"]
        print(f"| {s} | {B['ar']['decode_tokens_per_s']:.1f} | {lb['decode_tokens_per_s']:.1f} "
              f"| {B['ar']['decode_tokens_per_s'] / lb['decode_tokens_per_s']:.2f} "
              f"| {B['ar']['tokens_per_s']:.1f} | {B['auto']['tokens_per_s']:.1f} | {lb['tokens_per_s']:.1f} "
              f"| {B['auto']['tokens_per_s'] / lb['tokens_per_s']:.2f} | {B['llama-cpp']['tokens_per_s']:.1f} "
              f"| {F['ar']['tokens_per_s']:.1f} | {F['auto']['tokens_per_s']:.1f} | {lf['tokens_per_s']:.1f} "
              f"| {rate(B, lb, 'ar') / rate(F, lf, 'ar'):.2f} | {rate(B, lb, 'auto') / rate(F, lf, 'auto'):.2f} "
              f"| ar {ident(B['ar'])}, auto {ident(B['auto'])}; stored {ident(lb)}, F32 {ident(B['llama-cpp'])} |")


def one_run(prefix: str, run: str) -> None:
    print("| set | `ar` decode tok/s | llama.cpp stored decode | ratio | `auto` tok/s | llama.cpp stored tok/s | "
          "`auto` / llama.cpp | best single method | `auto` / best | identical to `ar` |")
    print("|" + "---|" * 10)
    ratios = []
    for s in SETS:
        try:
            b = json.loads(open(f"{prefix}-{s}-blocks-{run}.jsonl").readline())
        except FileNotFoundError:
            continue
        B = {r["method"]: r for r in b["results"]}
        ar, llama, auto = B["ar"], B["llama-cpp-stored"], B["auto"]
        best = max((m for m in ("pld", "ngram-trie") if m in B), key=lambda m: B[m]["tokens_per_s"])
        ratios.append(auto["tokens_per_s"] / B[best]["tokens_per_s"])
        print(f"| {s} | {ar['decode_tokens_per_s']:.1f} | {llama['decode_tokens_per_s']:.1f} "
              f"| {ar['decode_tokens_per_s'] / llama['decode_tokens_per_s']:.2f} | {auto['tokens_per_s']:.1f} "
              f"| {llama['tokens_per_s']:.1f} | {auto['tokens_per_s'] / llama['tokens_per_s']:.2f} "
              f"| `{best}` {B[best]['tokens_per_s']:.1f} | {ratios[-1]:.2f} "
              f"| ar {ident(ar)}, auto {ident(auto)}, {best} {ident(B[best])}; llama.cpp {ident(llama)} |")
    if ratios:
        print(f"\n`auto` / best single method, geometric mean over {len(ratios)} sets: "
              f"{math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("prefix")
    ap.add_argument("--run", default=None, help="the blocks run alone: PREFIX-SET-blocks-RUN.jsonl")
    args = ap.parse_args()
    one_run(args.prefix, args.run) if args.run else with_float32(args.prefix)
