"""The `auto` issue's table (issue 20; docs/benchmarks.md, "`auto`, the default") from the records of
`bash scripts/bench_auto.sh MODEL STORES OUT_PREFIX`: per set, `auto` with every source against the best single
method of the same run, `auto` with no flags, transformers' baselines and `auto`'s accepted/verified per source;
then the geometric means over the sets.

    python scripts/auto_default_table.py OUT_PREFIX      (e.g. docs/results/auto-default-after-tiles/cpu-smollm2-135m)
"""
import json
import math
import sys

pre = sys.argv[1]
sets = ["humaneval", "long-edit", "rag", "mt-bench"]
singles = ["pld", "ngram-trie", "rest", "aded", "sd"]
geo = {}
print("| set | auto, every source (acc. len) | best single method | auto / best | auto, no flags (acc. len) | transformers | accepted/verified by source (g = gated steps) | identical to ar |")
print("|---|---|---|---|---|---|---|---|")
for s in sets:
    try:
        full = [json.loads(l) for l in open(f"{pre}-{s}.jsonl")][-1]
        bare = [json.loads(l) for l in open(f"{pre}-{s}-bare.jsonl")][-1]
    except FileNotFoundError:
        continue
    R = {r["method"]: r for r in full["results"]}
    B = {r["method"]: r for r in bare["results"]}
    best = max(singles, key=lambda m: R[m]["speedup"] if m in R else 0)
    a = R["auto"]
    for m in ["auto"] + singles:
        geo.setdefault(m, []).append(R[m]["speedup"])
    geo.setdefault("bare", []).append(B["auto"]["speedup"])
    hf = " ".join(f"{m} {R[m]['speedup']:.2f}" for m in ("hf", "hf-pld") if m in R)
    src = ", ".join(f"{n} {v['accepted']}/{v['verified']}" + (f" g{v['gated_steps']}" if v.get("gated_steps") else "")
                    for n, v in (a.get("sources") or {}).items())
    ident = all(r.get("lossless", True) for r in full["results"]) and all(r.get("lossless", True) for r in bare["results"])
    print(f"| {s} | **{a['speedup']:.2f}** ({a['mean_accepted_length']:.2f}) | {best} {R[best]['speedup']:.2f} ({R[best]['mean_accepted_length']:.2f}) | {a['speedup']/R[best]['speedup']:.2f} | {B['auto']['speedup']:.2f} ({B['auto']['mean_accepted_length']:.2f}) | {hf} | {src} | {'yes' if ident else 'NO'} |")
g = {m: math.exp(sum(map(math.log, v)) / len(v)) for m, v in geo.items()}
bs = max(singles, key=lambda m: g[m])
print()
print(f"geometric means over {len(geo['auto'])} sets: auto {g['auto']:.2f}, auto no flags {g['bare']:.2f}; singles " + ", ".join(f"{m} {g[m]:.2f}" for m in singles) + f"; auto / best single ({bs}) = {g['auto']/g[bs]:.2f}")
