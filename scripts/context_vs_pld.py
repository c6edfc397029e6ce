"""Which occurrence each copy drafter picks, and how long its chain survives, replayed on recorded `ar` outputs
(scripts/ar_outputs.py): deterministic, no model, no timing (issue 36).

Drafters, each as a plain chain of its best guess (no budget, no calibration, so only the choice of occurrence
differs):

* `pld`     -- prompt lookup: the leftmost occurrence of the longest tail n-gram (n <= 3), 10 tokens;
* `recent`  -- `auto`'s context index before issue 36: the most recent occurrences (up to 16) of the longest tail
               n-gram (n <= 8), the most frequent path of their trie, 16 tokens;
* `cursor`  -- the copy cursor (drafting/ngram_index.CopyCursor): the occurrence the last steps were copying, or
               the tail found again near where the copy was left, else the most recent occurrence; 16 tokens.

Two views: each drafter on its own trajectory (accepted tokens per step, drafted tokens), and all of them on the
*same* steps -- the positions of pld's trajectory -- with the occurrence each chose.

    PYTHONPATH=. python scripts/context_vs_pld.py docs/results/ar-outputs/ar-smollm2-135m-wide.json.gz \
        [--category hints] [--steps ID]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdec_cli.drafting.count_trie import count_trie  # noqa: E402
from specdec_cli.drafting.ngram_index import CopyCursor, NgramIndex  # noqa: E402
from specdec_cli.drafting.prompt_lookup import FirstOccurrenceIndex  # noqa: E402

MAX_N = 8  # auto's context index: longest n-gram
ROWS = 16  # ... occurrences walked
CONT = 16  # ... deepest node
PLD_N, PLD_K = 3, 10  # pld's defaults (max_ngram, num_pred)


def load_outputs(path: str) -> dict:
    """A file of scripts/ar_outputs.py (gzipped too: docs/results/ar-outputs/)."""
    import gzip

    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return json.load(fh)


def agree(chain: list[int], truth: list[int], at: int) -> int:
    k = 0
    while k < len(chain) and at + k < len(truth) and chain[k] == truth[at + k]:
        k += 1
    return k


class Pld:
    def __init__(self, prompt):
        self.index = FirstOccurrenceIndex(PLD_N)
        self.index.prepare(list(prompt))

    def draft(self, seq: list[int]) -> tuple[list[int], int]:
        chain, size = self.index.lookup(seq, PLD_K)
        return chain, self.index.first[tuple(seq[len(seq) - size:])] + size if chain else -1


class Recent:
    def __init__(self, prompt):
        self.index = NgramIndex(range(1, MAX_N + 1), ROWS)
        self.index.extend(list(prompt))

    def draft(self, seq: list[int]) -> tuple[list[int], int]:
        self.index.follow(seq)
        n, starts = self.index.find(seq, ROWS)
        if not starts:
            return [], -1
        trie = count_trie(self.index.rows(starts, CONT))
        chain, node = [], -1
        while True:  # the most frequent child, level by level (ties: the trie's order)
            kids = [i for i in range(len(trie)) if trie.parents[i] == node]
            if not kids:
                break
            node = max(kids, key=lambda i: trie.counts[i])
            chain.append(int(trie.tokens[node]))
        return chain, starts[0]


class Cursor:
    def __init__(self, prompt):
        self.index = NgramIndex(range(1, MAX_N + 1), ROWS)
        self.index.extend(list(prompt))
        self.cursor = CopyCursor(self.index)

    def draft(self, seq: list[int]) -> tuple[list[int], int]:
        self.index.follow(seq)
        starts, _, _, _ = self.cursor.candidates(seq, ROWS, MAX_N)
        return (self.index.continuation(starts[0], CONT), starts[0]) if starts else ([], -1)


class Oracle:
    """An upper bound: of every earlier occurrence of the tail's last ``n`` tokens (n = 2, else 1), the one whose
    continuation the target then wrote longest (it reads the answer: no drafter can choose better)."""

    truth: list[int] = []

    def __init__(self, prompt):
        pass

    def draft(self, seq: list[int]) -> tuple[list[int], int]:
        truth, at = Oracle.truth, len(seq)
        best, where = [], -1
        for n in (2, 1):
            for q in range(n, at):
                if seq[q - n: q] == seq[at - n:]:
                    chain = seq[q: q + CONT]
                    if agree(chain, truth, at) > agree(best, truth, at):
                        best, where = chain, q
            if where >= 0:
                break
        return best, where


class CursorIfLonger(Recent):
    """The cursor's continuation only when its evidence (tokens copied in a row) is at least the longest tail
    n-gram's length; otherwise what `recent` drafts."""

    def __init__(self, prompt):
        super().__init__(prompt)
        self.cursor = CopyCursor(self.index)

    def draft(self, seq: list[int]) -> tuple[list[int], int]:
        self.index.follow(seq)
        starts, _, n, run = self.cursor.candidates(seq, ROWS, MAX_N)
        if run > 0 and run >= n:
            return self.index.continuation(starts[0], CONT), starts[0]
        return super().draft(seq)


class Longest(Recent):
    """Of the most recent occurrences of the longest tail n-gram (and the cursor's), the one whose preceding text
    agrees with the sequence's longest (up to 64 tokens), ties to the most recent."""

    def __init__(self, prompt):
        super().__init__(prompt)
        self.cursor = CopyCursor(self.index)

    def draft(self, seq: list[int]) -> tuple[list[int], int]:
        self.index.follow(seq)
        starts, _, n, run = self.cursor.candidates(seq, ROWS, MAX_N)
        if not starts:
            return [], -1
        m = [self.index.tail_match(seq, p, 64) for p in starts]
        best = max(range(len(starts)), key=lambda i: (m[i], -i))
        return self.index.continuation(starts[best], CONT), starts[best]


DRAFTERS = {"pld": Pld, "recent": Recent, "cursor": Cursor, "cursor2": CursorIfLonger, "longest": Longest,
            "oracle": Oracle}


def own_trajectory(kind, prompt, truth) -> dict:
    d, at = DRAFTERS[kind](prompt), len(prompt)
    steps = drafted = accepted = 0
    while at < len(truth):
        chain, _ = d.draft(truth[:at])
        k = agree(chain, truth, at)
        steps, drafted, accepted, at = steps + 1, drafted + len(chain), accepted + k, at + k + 1
    return {"steps": steps, "drafted": drafted, "accepted": accepted}


def same_steps(prompt, truth, show: bool) -> dict:
    """Every drafter at the positions of pld's own trajectory; tallies of who accepted more than pld."""
    ds = {k: cls(prompt) for k, cls in DRAFTERS.items()}
    at, tally = len(prompt), {k: {"more": 0, "less": 0, "acc": 0, "other_place": 0} for k in DRAFTERS}
    while at < len(truth):
        seq = truth[:at]
        got = {k: d.draft(seq) for k, d in ds.items()}
        acc = {k: agree(chain, truth, at) for k, (chain, _) in got.items()}
        for k in DRAFTERS:
            t = tally[k]
            t["acc"] += acc[k]
            t["more"] += acc[k] > acc["pld"]
            t["less"] += acc[k] < acc["pld"]
            t["other_place"] += got[k][1] != got["pld"][1]
        if show:
            print(f"  @{at - len(prompt):3d} " + "  ".join(f"{k}: from {got[k][1]:4d} acc {acc[k]:2d}" for k in DRAFTERS))
        at += acc["pld"] + 1
    return tally


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outputs", nargs="+")
    parser.add_argument("--category", default=None)
    parser.add_argument("--steps", default=None, help="print every step of this prompt id")
    args = parser.parse_args()
    for path in args.outputs:
        data = load_outputs(path)
        total = {k: {"steps": 0, "drafted": 0, "accepted": 0} for k in DRAFTERS}
        same = {k: {"more": 0, "less": 0, "acc": 0, "other_place": 0} for k in DRAFTERS}
        for row in data["rows"]:
            if args.category and row["category"] != args.category:
                continue
            truth = row["prompt"] + row["output"]
            Oracle.truth = truth
            for k in DRAFTERS:
                for key, v in own_trajectory(k, row["prompt"], truth).items():
                    total[k][key] += v
            show = args.steps == row["id"]
            if show:
                print(f"{row['id']} (turn {row['turn']}), output positions:")
            for k, t in same_steps(row["prompt"], truth, show).items():
                for key, v in t.items():
                    same[k][key] += v
        print(f"{Path(path).name}{' [' + args.category + ']' if args.category else ''}")
        for k in DRAFTERS:
            t, s = total[k], same[k]
            print(f"  {k:7s} own trajectory: {t['steps']:5d} steps, accepted {t['accepted']:5d} "
                  f"({t['accepted'] / max(t['steps'], 1):.2f}/step) of {t['drafted']:6d} drafted "
                  f"({t['accepted'] / max(t['drafted'], 1):.0%}) | on pld's steps: accepted {s['acc']:5d}, "
                  f"more than pld {s['more']:4d}, less {s['less']:4d}, another occurrence {s['other_place']:4d}")


if __name__ == "__main__":
    main()
