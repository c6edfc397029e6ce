"""Why a draft does or does not pay: the target's and the draft's measured step times (runtime.profile) and the
acceptance of the draft's chain per position (sd, --budget paper: a fixed window, verified whole), as JSON.

    python scripts/draft_acceptance.py --model gemma3-270m --draft smollm2-135m --prompts mt-bench --limit 8

Accepted through position i = P(draft tokens 1..i all accepted | token i drafted); the conditional acceptance of
position i is its ratio to position i-1's.
"""

from __future__ import annotations

import argparse
import json

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--draft", default="smollm2-135m")
    parser.add_argument("--prompts", default="mt-bench")
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("-n", "--max-new-tokens", type=int, default=128)
    parser.add_argument("--window", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from specdec_cli import api
    from specdec_cli.bench.runners import encode_turn
    from specdec_cli.io.prompts import load_prompts
    from specdec_cli.runtime.profile import profile_for

    target, drafts = api.load(args.model, [args.draft])
    settings = api.RunSettings(max_new_tokens=args.max_new_tokens, window=args.window, budget="paper")
    drafter = api.make_drafter("sd", target, drafts, settings)
    reached, kept = [0] * args.window, [0] * args.window
    for prompt in load_prompts(args.prompts, args.limit):
        ids = encode_turn(target, prompt, 0, [], args.max_new_tokens)
        for step in api.run(target, ids, drafter, settings).steps:
            for i in range(step.drafted):
                reached[i] += 1
                kept[i] += i < step.accepted
    t_target, t_draft = profile_for(target.model), profile_for(drafts[0].model)
    print(json.dumps({
        "target": args.model, "draft": args.draft, "prompts": f"{args.prompts} x{args.limit}",
        "target_step_ms": round(1000 * t_target(1), 2), "draft_step_ms": round(1000 * t_draft(1), 2),
        "draft_over_target": round(t_draft(1) / t_target(1), 3),
        "accepted_through_position": [round(k / r, 3) if r else None for k, r in zip(kept, reached)],
        "drafted_by_position": reached,
    }))


if __name__ == "__main__":
    main()
