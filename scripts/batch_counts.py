"""Per-prompt counts (target forwards, emitted, drafted, accepted) of every method decoding a batch, to show that a
refactor of the batched loop keeps behaviour -- the batched twin of scripts/counts.sh (bench's latency mode runs one
sequence at a time). Greedy with ``--budget paper`` and sampled (t = 0.8) with ``--budget auto``. The sampled runs
are reproducible. The greedy ones are reproducible on a quiet core only: a greedy batch chooses its draft width
from measured forward times, even under ``paper``, so a loaded core can move ``drafted`` and ``forwards`` (the
tokens stay identical). Run both sides on a quiet core.
    python scripts/batch_counts.py STORE_PREFIX --batch-size 4 > counts.jsonl     # on the code before, then after
    diff before.jsonl after.jsonl
STORE_PREFIX-sa and STORE_PREFIX-tri: suffix-array and tri-gram datastores built with SmolLM2 (scripts/counts.sh).
"""

from __future__ import annotations

import argparse
import json
import sys

METHODS = ("ar", "sd", "self-verify", "hsddw", "rest", "aded", "ngram-trie", "pld", "auto")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("stores")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--prompts", default="humaneval")
    parser.add_argument("--limit", type=int, default=4)
    parser.add_argument("-n", type=int, default=32)
    args = parser.parse_args()

    from specdec_cli import api
    from specdec_cli.config import RunSettings, SamplingConfig
    from specdec_cli.io.prompts import load_prompts
    from specdec_cli.runtime.machine import set_threads

    set_threads(1)
    target, drafts = api.load("smollm2-135m", ["int8:", "bf16:"])
    prompts = [api.encode_prompt(target, p.turns[0], max_new_tokens=args.n)
               for p in load_prompts(args.prompts, args.limit)]
    stores = {"rest": [f"{args.stores}-sa"], "aded": [f"{args.stores}-tri"],
              "auto": [f"{args.stores}-sa", f"{args.stores}-tri"]}
    for budget, temperature in (("paper", 0.0), ("auto", 0.8)):
        settings = RunSettings(args.n, SamplingConfig(temperature), 1, None, budget, 1)
        for method in METHODS:
            drafters = api.make_drafters(method, target, drafts, settings, batch_size=args.batch_size,
                                         datastore=stores.get(method, []))
            results = api.run_batch(target, prompts, drafters, settings)
            for i, res in enumerate(results):
                s = res.summary()
                print(json.dumps({"budget": budget, "t": temperature, "method": method, "prompt": i,
                                  "forwards": s["target_forwards"], "emitted": s["new_tokens"],
                                  "drafted": s["drafted"], "accepted": s["accepted"], "tokens": res.tokens}))
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
