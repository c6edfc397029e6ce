"""``pld``: prompt lookup decoding (Saxena 2023), the algorithm of transformers' ``prompt_lookup_num_tokens``.

Take the last ``max_ngram`` tokens of the sequence (prompt + output); find their first earlier occurrence; the
``num_pred`` tokens that followed it are the draft chain. No match: try one token shorter, down to
``min_ngram``. No match at all: an empty draft (a plain autoregressive step).

Options (max_ngram, min_ngram, num_pred -- ``--window`` sets it too): see ``specdec methods``.
"""

from __future__ import annotations

from ..drafting.prompt_lookup import FirstOccurrenceIndex
from ..engine.loop import Draft, Drafter


class PromptLookup(Drafter):
    name = "pld"

    def __init__(self, max_ngram: int = 3, num_pred: int = 10, min_ngram: int = 1, stop_ids=frozenset()):
        self.max_ngram, self.num_pred, self.min_ngram = max_ngram, num_pred, min_ngram
        self.stop_ids = frozenset(stop_ids)
        self.hits = self.lookups = 0

    def start(self, prompt, cfg, generator) -> None:
        super().start(prompt, cfg, generator)
        self.hits = self.lookups = 0
        self.index = FirstOccurrenceIndex(self.max_ngram)
        self.index.prepare(list(prompt))  # with the prefill, not in the first step

    def propose(self, tokens: list[int], max_tokens: int) -> Draft:
        k = min(self.num_pred, max_tokens)
        if k < 1:
            return Draft()
        draft, size = self.index.lookup(tokens, k, self.min_ngram)
        cut = next((i for i, t in enumerate(draft) if t in self.stop_ids), None)
        if cut is not None:  # as transformers does: nothing after an end-of-sequence token
            draft = draft[:cut]
        self.lookups += 1
        self.hits += bool(draft)
        # a longer matching n-gram is a better bet; the budget learns the per-position rates from there
        return Draft.chain(draft, scores=[min(0.25 + 0.2 * size, 0.95)] * len(draft))

    def stats(self) -> dict:
        return {"pld_hit_rate": self.hits / self.lookups if self.lookups else 0.0}


def build(ctx) -> Drafter:
    return PromptLookup(ctx.opt("max_ngram"), ctx.window or ctx.opt("num_pred"), ctx.opt("min_ngram"),
                        getattr(ctx.target, "stop_ids", frozenset()))
