"""A prompt file drawing a few prompts from each of several named sets (category = the set's name), so that one
bench run -- one engine start per method on vLLM, minutes each here -- covers code, chat, rag and edits.
    python scripts/mixed_set.py humaneval:3 mt-bench:3 rag:3 long-edit:3 > mixed.jsonl
"""

from __future__ import annotations

import json
import sys

from specdec_cli.io.prompts import load_prompts


def main(specs: list[str]) -> int:
    for spec in specs:
        name, _, count = spec.partition(":")
        for p in load_prompts(name, int(count or 8)):
            print(json.dumps({"id": f"{name}/{p.id}", "category": name, "turns": p.turns, "raw": p.raw}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
