"""Memory across requests: the target's verified outputs, kept in memory for later drafts.

Repeated and agentic workloads ask similar things again (SuffixDecoding's global suffix tree; llama.cpp's dynamic
n-gram cache): what the target wrote for one request is the best draft for the next similar one. An
:class:`OutputMemory` stores every finished generation (prompt tail + output) and indexes its n-grams of a few
fixed lengths by first position, so a lookup costs a handful of dict probes. ``rest`` consults it beside its
datastore (``--opt memory=1``): continuations found in memory are counted ``weight`` times in the frequency trie, so
they outrank the datastore's when both match. Drafts only: verification is unchanged, so this is as exact as
every other draft source.
"""

from __future__ import annotations

import numpy as np

NGRAM_SIZES = (12, 8, 4)  # tried longest first
MAX_POSITIONS = 32  # continuations kept per n-gram
MAX_TOKENS = 2_000_000  # memory is cleared (oldest first) beyond this


class OutputMemory:
    def __init__(self, sizes=NGRAM_SIZES, max_tokens: int = MAX_TOKENS):
        self.sizes = tuple(sorted(sizes, reverse=True))
        self.max_tokens = max_tokens
        self.clear()

    def clear(self) -> None:
        self.tokens: list[int] = []
        self.index: dict[tuple[int, ...], list[int]] = {}
        self.generations = 0

    def add(self, tokens: list[int]) -> None:
        """Remember one finished sequence (a -1 separator keeps matches inside it)."""
        if len(self.tokens) + len(tokens) > self.max_tokens:
            self.clear()
        start = len(self.tokens)
        self.tokens.extend(tokens)
        self.tokens.append(-1)
        for size in self.sizes:
            for i in range(start, len(self.tokens) - size):
                positions = self.index.setdefault(tuple(self.tokens[i: i + size]), [])
                if len(positions) < MAX_POSITIONS:
                    positions.append(i + size)
        self.generations += 1

    def continuations(self, context: list[int], length: int) -> tuple[int, np.ndarray]:
        """``(matched n-gram size, rows of up to length tokens, -1 padded)`` after the longest indexed tail."""
        for size in self.sizes:
            if len(context) < size:
                continue
            positions = self.index.get(tuple(context[-size:]))
            if positions:
                rows = np.full((len(positions), length), -1, dtype=np.int64)
                for r, p in enumerate(positions):
                    cont = self.tokens[p: p + length]
                    cut = cont.index(-1) if -1 in cont else len(cont)
                    rows[r, :cut] = cont[:cut]
                return size, rows[(rows[:, 0] >= 0)]
        return 0, np.empty((0, length), dtype=np.int64)
