"""Which sequence each batch row holds, when the engine says only the rows' tokens (vLLM's proposer interface:
``sampled_token_ids``, ``num_tokens_no_spec``, ``token_ids_cpu``; no request ids).

A row continues a sequence the drafter knows when its length is that sequence's plus the tokens just sampled,
and its first tokens and the token before the new ones are the sequence's. The row a sequence was in last step
is tried first; vLLM moves rows when requests finish (it condenses the batch), so the other live sequences are
tried next. A row that continues none is a new request; a live sequence that no row holds has finished and
leaves (its output joins the memory). A wrong match could only cost speed: drafts are verified by the engine.

The :class:`RowTracker` also times the engine's steps (the interval between two calls is one step) against the
tokens each step computed, for the drafter's :class:`~specdec_cli.serving.pricing.StepCost`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from .chains import ChainDrafter

HEAD = 8  # first tokens of a row compared with a sequence's (identical prompts share them; lengths tell apart)


@dataclass
class Tracked:
    length: int  # tokens the drafter holds for the sequence
    head: list[int]
    sent: int = 0  # draft tokens sent for it last step


class RowTracker:
    def __init__(self, drafter: ChainDrafter, max_draft: int, max_model_len: int):
        self.drafter, self.max_draft, self.max_model_len = drafter, max_draft, max_model_len
        self.live: dict[int, Tracked] = {}
        self.by_row: list[int | None] = []
        self.next_id = 0
        self.last_call: float | None = None

    def propose(self, sampled: list[list[int]], num_tokens, token_ids) -> list[list[int]]:
        """One chain per row (``[]`` for rows still prefilling); the drafter is advanced, begun and ended as the
        rows say."""
        t0 = time.perf_counter()
        rows = len(sampled)
        claimed: dict[int, int] = {}
        drafting: list[int | None] = [None] * rows
        prefill, computed, emitted = False, 0, 0
        for i, new in enumerate(sampled):
            n = int(num_tokens[i])
            seq = self._match(i, n - len(new), token_ids, claimed)
            if seq is None:
                prefill = True  # the step prefilled this row's prompt (or a chunk of it)
                if not new:
                    continue
                seq = self._begin(i, n - len(new), token_ids)
            elif new:
                computed += 1 + self.live[seq].sent
                emitted += len(new)
            claimed[seq] = i
            if new:
                self.drafter.advance(seq, list(new))
                self.live[seq].length = n
                drafting[i] = seq if n < self.max_model_len - 1 else None
        for seq in [s for s in self.live if s not in claimed]:
            self.drafter.end(seq)
            del self.live[seq]
        self.by_row = [None] * rows
        for seq, i in claimed.items():
            self.by_row[i] = seq
        if self.last_call is not None and not prefill and computed:
            self.drafter.cost.observe(computed, t0 - self.last_call, emitted)
        self.last_call = t0
        return self._draft(drafting, num_tokens, t0)

    def _draft(self, drafting: list[int | None], num_tokens, t0: float) -> list[list[int]]:
        rows = [i for i, seq in enumerate(drafting) if seq is not None]
        limits = [min(self.max_draft, self.max_model_len - 1 - int(num_tokens[i])) for i in rows]
        chains = self.drafter.draft([drafting[i] for i in rows], limits)
        out: list[list[int]] = [[] for _ in drafting]
        for i, chain in zip(rows, chains):
            out[i] = chain
            self.live[drafting[i]].sent = len(chain)
        self.drafter.record_call(len(rows), time.perf_counter() - t0)
        return out

    def _match(self, row: int, length: int, token_ids, claimed: dict) -> int | None:
        """The live sequence row ``row`` continues (``length`` tokens before the new ones), or None."""
        if length < 1:
            return None
        head = token_ids[row, : min(HEAD, length)].tolist()
        last = int(token_ids[row, length - 1])
        first = self.by_row[row] if row < len(self.by_row) else None
        for seq in ([first] if first is not None else []) + list(self.live):
            tracked = self.live.get(seq)
            if tracked is not None and seq not in claimed and tracked.length == length and \
                    tracked.head == head and self.drafter.tokens(seq)[-1] == last:
                return seq
        return None

    def _begin(self, row: int, length: int, token_ids) -> int:
        seq, self.next_id = self.next_id, self.next_id + 1
        prompt = token_ids[row, :length].tolist()
        self.drafter.begin(seq, prompt)
        self.live[seq] = Tracked(length, prompt[:HEAD])
        return seq
