"""Batched throughput of one checkout (the one on PYTHONPATH), for back-to-back comparisons of two releases
(issue 34: batched `ar` and `auto` against the release the issue was filed on):

    PYTHONPATH=CHECKOUT python scripts/batch_throughput.py --model smollm2-135m --prompts humaneval \
        [--limit 32] [--sizes 8,32] [--methods ar,auto] [--threads 2] [-n 128] [--kernels blocks] [--json]

Unlike `specdec bench --batch-size` it runs neither sequential `ar` nor transformers' batched generate (minutes
each on two cores): per method and batch size, one untimed warm-up (B prompts, 8 tokens: the batch profile is
measured there), then the timed run over every prompt's first turn, with a fresh set of drafters. It prints tokens
per second, target forwards (summed over the sequences: a batch's forward counts once per row in it) and a
digest of the outputs, so two checkouts' outputs can be compared (they must match: greedy batched rows equal
their own `ar` output). It calls `api.make_drafters(..., count=B)`, the spelling older releases know.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

WARMUP_TOKENS = 8  # as bench's warm-up generation


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--prompts", default="humaneval", choices=("humaneval", "mt-bench"))
    ap.add_argument("--limit", type=int, default=32)
    ap.add_argument("--sizes", default="8,32")
    ap.add_argument("--methods", default="ar,auto")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("-n", "--max-new-tokens", type=int, default=128)
    ap.add_argument("--kernels", default=None, help="api.load's kernel_mode (blocks: --kernels blocks); left out: "
                    "the checkout's default, the spelling every release knows")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from specdec_cli import api
    from specdec_cli.io import prompt_sets
    from specdec_cli.runtime.machine import set_threads

    set_threads(args.threads)
    target, _ = api.load(args.model) if args.kernels is None else api.load(args.model, kernel_mode=args.kernels)
    load = prompt_sets.load_humaneval if args.prompts == "humaneval" else prompt_sets.load_mt_bench
    prompts = load()[: args.limit]
    n = args.max_new_tokens
    ids = [api.encode_prompt(target, p.turns[0], raw=p.raw, max_new_tokens=n) for p in prompts]
    rows = []
    for size in [int(s) for s in args.sizes.split(",")]:
        for method in args.methods.split(","):
            drafters = api.make_drafters(method, target, [], api.RunSettings(max_new_tokens=n), count=size)
            api.run_batch(target, ids[:size], drafters, max_new_tokens=WARMUP_TOKENS)
            drafters = api.make_drafters(method, target, [], api.RunSettings(max_new_tokens=n), count=size)
            steps: list[tuple[int, float]] = []  # (rows, seconds) of every batched forward
            t0 = time.perf_counter()
            results = api.run_batch(target, ids, drafters, max_new_tokens=n,
                                    on_step=lambda rows, s: steps.append((rows, s)))
            seconds = time.perf_counter() - t0
            new = sum(len(r.tokens) for r in results)
            digest = hashlib.sha256(json.dumps([r.tokens for r in results]).encode()).hexdigest()[:16]
            row = {"model": args.model, "prompts": args.prompts, "kernels": args.kernels or "default",
                   "method": method, "batch_size": size,
                   "tokens": new, "seconds": round(seconds, 3), "tokens_per_s": round(new / seconds, 2),
                   "forwards": sum(r.summary()["target_forwards"] for r in results), "outputs": digest,
                   # where the time went: each prompt's prefill (alone), the batched steps (forward + verify), the rest
                   "prefill_s": round(sum(r.prefill_s for r in results), 3),
                   "steps": len(steps), "step_s": round(sum(s for _, s in steps), 3)}
            rows.append(row)
            print(json.dumps(row) if args.json else
                  f"{method:5s} B={size:<3d} {row['tokens_per_s']:7.1f} tok/s  {new} tokens in {seconds:.1f} s  "
                  f"forwards {row['forwards']}  outputs {digest}", flush=True)


if __name__ == "__main__":
    main()
