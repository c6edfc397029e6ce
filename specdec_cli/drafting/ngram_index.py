"""Every recent position of every n-gram (of the lengths in ``sizes``) of a growing token buffer, and the continuations that
followed them.

One index serves both the request's own context (prompt + output so far: what prompt lookup, the N-gram trie and
``rest``'s context drafting each index separately) and the memory of earlier outputs (several sequences in one
buffer, separated by ``-1``, so no match or continuation crosses from one to the next). It is updated with the new
tokens only, a handful of dict operations per token, so a lookup costs the same on a 4,000-token prompt as on a
short one. Unlike prompt lookup's leftmost match, a lookup returns the continuations of the *most recent*
occurrences of the longest matching tail (SuffixDecoding's per-request tree), so a frequency trie over them ranks
what usually follows.
"""

from __future__ import annotations

import numpy as np

SEPARATOR = -1


class NgramIndex:
    """Per n-gram length: the last end position of each n-gram (a dict of ints, keyed by the n-gram's hash) and,
    per position, the previous end position of the same n-gram: occurrences are a linked list through a flat list.
    No per-n-gram container: the garbage collector has nothing to walk however long the buffer grows (lists per
    n-gram made multi-millisecond collection pauses). A lookup checks the tokens it matched, so a hash collision
    costs a probe, never a wrong continuation."""

    def __init__(self, sizes=tuple(range(1, 9)), max_positions: int = 16):
        self.sizes = tuple(sorted(set(int(n) for n in sizes)))
        self.max_positions = max_positions  # occurrences walked per lookup
        self.clear()

    def clear(self) -> None:
        self.tokens: list[int] = []
        self.last_separator = -1
        self.last: dict[int, dict[int, int]] = {n: {} for n in self.sizes}  # n -> hash -> end position
        self.prev: dict[int, list[int]] = {n: [-1] for n in self.sizes}  # n -> end position -> previous one

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, new: list[int]) -> None:
        """Append tokens (``-1`` separates sequences) and index the n-grams that end in them."""
        buf = self.tokens
        start = len(buf)
        buf.extend(new)
        for n in self.sizes:
            self.prev[n].extend([-1] * len(new))
        for i in range(start, len(buf)):
            if buf[i] == SEPARATOR:
                self.last_separator = i
                continue
            for n in self.sizes:
                j = i - n + 1
                if j <= self.last_separator:  # j < 0 too: the buffer starts after a virtual separator at -1
                    break
                key = hash(tuple(buf[j: i + 1]))
                last = self.last[n]
                self.prev[n][i + 1] = last.get(key, -1)
                last[key] = i + 1

    def follow(self, tokens: list[int]) -> None:
        """Keep the buffer equal to ``tokens``, a list that only grows (the engine's sequence)."""
        if len(tokens) > len(self.tokens):
            self.extend(tokens[len(self.tokens):])

    def lookup(self, context: list[int], length: int, max_rows: int, min_n: int = 1) -> tuple[int, np.ndarray]:
        """``(n, rows)``: the continuations (up to ``length`` tokens, ``-1`` padded, most recent occurrence first)
        of the longest tail n-gram of ``context`` that occurred with at least one following token; ``n = 0`` and
        no rows when none did."""
        buf = self.tokens
        end = len(buf)
        for n in reversed(self.sizes):
            if n > len(context) or n < min_n:
                continue
            tail = context[len(context) - n:]
            p = self.last[n].get(hash(tuple(tail)), -1)
            starts: list[int] = []
            walked = 0
            while p >= 0 and len(starts) < max_rows and walked < self.max_positions:
                walked += 1
                if p < end and buf[p] != SEPARATOR and buf[p - n: p] == tail:
                    starts.append(p)
                p = self.prev[n][p]
            if not starts:
                continue
            rows = np.full((len(starts), length), SEPARATOR, dtype=np.int64)
            for r, p in enumerate(starts):
                cont = buf[p: p + length]
                if SEPARATOR in cont:
                    cont = cont[: cont.index(SEPARATOR)]
                rows[r, : len(cont)] = cont
            return n, rows
        return 0, np.empty((0, length), dtype=np.int64)
