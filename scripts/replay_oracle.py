"""How much of its sources' ceiling `auto` reaches, against `pld`'s (issue 36): replayed, no model.

For each set it replays (specdec_cli/bench/replay.py, against the recorded `ar` outputs of docs/results/ar-outputs/):
- `auto` and `pld` as they run (`--budget auto`): the modelled speedup over `ar`;
- the same drafter with everything it proposes verified (`--budget paper`; `auto` with no node limit), priced as if
  only the nodes the target accepts had been verified: the speedup a perfect selection would reach with what the
  sources offer (the *ceiling*).
The share of the ceiling a method reaches is what its budget's selection (its predictions) loses; the ratio of two
ceilings is what the sources themselves offer over each other.

    PYTHONPATH=. python scripts/replay_oracle.py MODEL [SETS...] [--profile FILE]
      (MODEL: smollm2-135m or gemma3-270m; SETS: humaneval mt-bench rag long-edit wide wide-heldout by default;
       --profile: forward times t(n) to price steps with, default those recorded with the outputs)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from replay_bench import WARMUP_TOKENS, load_outputs  # noqa: E402
from specdec_cli.bench import replay as R  # noqa: E402
from specdec_cli.runtime.profile import Profile  # noqa: E402

SETS = ["humaneval", "mt-bench", "rag", "long-edit", "wide", "wide-heldout"]
OUTPUTS = Path(__file__).resolve().parents[1] / "docs" / "results" / "ar-outputs"  # scripts/ar_outputs.py's files
UNLIMITED = "100000"  # auto's max_nodes: every node its sources propose (its default keeps 64)


def speeds(data: dict, profile: Profile, method: str, budget: str, options: dict) -> tuple[float, float]:
    """(tokens per modelled second as run, tokens per modelled second if only the accepted nodes were verified)."""
    stop = frozenset(data["stop_ids"])
    drafter = R.make_drafter(method, profile, data["vocab_size"], options, stop, budget=budget)
    R.replay(drafter, data["rows"][0]["prompt"], data["rows"][0]["output"], WARMUP_TOKENS, stop)
    tokens, spent, ideal = 0, 0.0, 0.0
    for row in data["rows"]:
        res = R.replay(drafter, row["prompt"], row["output"], data["max_new_tokens"], stop)
        tokens += res.new_tokens
        spent += res.verify_s
        ideal += sum(profile(accepted + 1) for _, _, accepted in res.steps)
    return tokens / spent, tokens / ideal


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("sets", nargs="*", default=SETS)
    parser.add_argument("--profile", default=None)
    args = parser.parse_args()
    print("| set | auto | auto's ceiling | share | pld | pld's ceiling | share | ceilings auto / pld |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.sets:
        data = load_outputs(OUTPUTS / f"ar-{args.model}-{name}.json.gz")
        times = json.loads(Path(args.profile).read_text()) if args.profile else data["profile"]
        profile = Profile(times["points"], times["seconds"])
        ar = speeds(data, profile, "ar", "paper", {})[0]
        auto = speeds(data, profile, "auto", "auto", {})[0] / ar
        auto_top = speeds(data, profile, "auto", "paper", {"max_nodes": UNLIMITED})[1] / ar
        pld = speeds(data, profile, "pld", "auto", {})[0] / ar
        pld_top = speeds(data, profile, "pld", "paper", {})[1] / ar
        print(f"| {name} | {auto:.2f}x | {auto_top:.2f}x | {auto / auto_top:.0%} | {pld:.2f}x | {pld_top:.2f}x | "
              f"{pld / pld_top:.0%} | {auto_top / pld_top:.2f} |", flush=True)


if __name__ == "__main__":
    main()
