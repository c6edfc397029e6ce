"""Record `ar`'s greedy outputs of a prompt set (every turn, with the stop token it ended on) and the model's
forward-time profile, for deterministic replays without the model (scripts/context_vs_pld.py,
scripts/replay_bench.py; specdec_cli/bench/replay.py).

    PYTHONPATH=. python scripts/ar_outputs.py --model smollm2-135m --prompts wide --limit 30 -n 128 \
        --out /tmp/ar-smollm2-wide.json

Multi-turn prompts (MT-Bench) get their later turns encoded as `bench` does: the earlier answers in the history.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdec_cli import api  # noqa: E402
from specdec_cli.bench.runners import encode_turn  # noqa: E402
from specdec_cli.engine.loop import Drafter  # noqa: E402
from specdec_cli.io.prompts import load_prompts  # noqa: E402
from specdec_cli.runtime import profile as hw  # noqa: E402
from specdec_cli.runtime.cache_mode import resolve  # noqa: E402
from specdec_cli.runtime.machine import set_threads  # noqa: E402


class Recorder(Drafter):
    """`ar` that keeps the whole sequence (the loop's output drops the stop token; a replay needs it)."""

    def accept(self, tokens, outcome) -> None:
        self.sequence = list(tokens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--prompts", required=True)
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--category", default=None)
    parser.add_argument("-n", "--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    set_threads(args.threads)
    target, _ = api.load(args.model)
    times = hw.profile_for(target.model, cache_mode=resolve("auto", target.model))
    rows = []
    for prompt in load_prompts(args.prompts, args.limit, args.category):
        answers: list[str] = []
        for turn in range(len(prompt.turns)):
            ids = encode_turn(target, prompt, turn, answers, args.max_new_tokens)
            rec = Recorder()
            result = api.run(target, ids, rec, max_new_tokens=args.max_new_tokens)
            answers.append(api.decode(target, result.tokens))
            rows.append({"id": prompt.id, "category": prompt.category, "turn": turn, "prompt": ids,
                         "output": rec.sequence[len(ids):], "stopped_by": result.stopped_by})
            print(f"{prompt.id} t{turn}: {len(ids)} + {len(result.tokens)} tokens", file=sys.stderr)
    data = {"model": args.model, "prompts": args.prompts, "max_new_tokens": args.max_new_tokens,
            "vocab_size": int(target.vocab_size), "stop_ids": sorted(int(s) for s in target.stop_ids),
            "profile": {"points": list(times.points), "seconds": list(times.seconds)}, "rows": rows}
    Path(args.out).write_text(json.dumps(data))


if __name__ == "__main__":
    main()
