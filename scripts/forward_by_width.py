"""What a real run's target forwards cost by query width (docs/profiling.md, "Where t(n) jumps"): each method's
generations over a prompt set, every step's drafted nodes and forward wall time read from ``GenerationResult.steps``,
the median per width ``n`` (root + draft nodes) printed beside the budget's profile of the same model.

    python scripts/forward_by_width.py smollm2-135m humaneval ar,auto,pld OUT.json [--limit 8] [-n 128]

Like ``specdec bench``: one drafter per method for the whole set, an 8-token warm-up generation first, one thread.
"""

from __future__ import annotations

import argparse
import collections
import json

import numpy as np
import torch

from specdec_cli import api
from specdec_cli.io.prompts import load_prompts
from specdec_cli.runtime import profile

WARMUP_TOKENS = 8  # bench's warm-up generation


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("prompts")
    parser.add_argument("methods")
    parser.add_argument("out")
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("-n", "--max-new-tokens", type=int, default=128)
    args = parser.parse_args()
    torch.set_num_threads(1)
    methods = args.methods.split(",")
    target, drafts = api.load(args.model)
    settings = api.RunSettings(max_new_tokens=args.max_new_tokens, threads=1)
    prompts = load_prompts(args.prompts, limit=args.limit)
    by_width: dict[tuple[str, int], list[float]] = collections.defaultdict(list)
    for method in methods:
        drafter = api.make_drafter(method, target, drafts, settings)
        first = prompts[0]
        api.run(target, api.encode_prompt(target, first.turns[0], raw=first.raw, max_new_tokens=settings.max_new_tokens),
                drafter, settings, max_new_tokens=WARMUP_TOKENS)
        for prompt in prompts:
            ids = api.encode_prompt(target, prompt.turns[0], raw=prompt.raw, max_new_tokens=settings.max_new_tokens)
            for step in api.run(target, ids, drafter, settings).steps:
                by_width[(method, 1 + step.drafted)].append(step.verify_s)
    budget_t = profile.profile_for(target.model)
    with open(args.out, "w", encoding="utf-8") as fh:
        json.dump({"model": args.model, "prompts": args.prompts, "limit": args.limit, "profile": budget_t.to_json(),
                   "seconds": {f"{m}|{n}": v for (m, n), v in sorted(by_width.items())}}, fh)
    print("| n | budget's t(n) ms | " + " | ".join(methods) + " |")
    print("|---" * (2 + len(methods)) + "|")
    for n in sorted({n for _, n in by_width}):
        cells = [f"{np.median(by_width[(m, n)]) * 1e3:.1f} ({len(by_width[(m, n)])})" if by_width.get((m, n)) else ""
                 for m in methods]
        print(f"| {n} | {budget_t(n) * 1e3:.1f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
