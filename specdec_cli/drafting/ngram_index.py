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
    def __init__(self, sizes=tuple(range(1, 9)), max_positions: int = 16):
        self.sizes = tuple(sorted(set(int(n) for n in sizes)))
        self.max_positions = max_positions
        self.clear()

    def clear(self) -> None:
        self.tokens: list[int] = []
        self.last_separator = -1
        self.positions: dict[tuple[int, ...], list[int]] = {}  # n-gram -> positions right after it, oldest first

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, new: list[int]) -> None:
        """Append tokens (``-1`` separates sequences) and index the n-grams that end in them."""
        buf, index, cap = self.tokens, self.positions, self.max_positions
        start = len(buf)
        buf.extend(new)
        for i in range(start, len(buf)):
            if buf[i] == SEPARATOR:
                self.last_separator = i
                continue
            for n in self.sizes:
                j = i - n + 1
                if j <= self.last_separator:  # j < 0 too: the buffer starts after a virtual separator at -1
                    break
                key = tuple(buf[j: i + 1])
                found = index.get(key)
                if found is None:
                    index[key] = [i + 1]
                else:
                    found.append(i + 1)
                    if len(found) > cap:
                        del found[0]

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
            found = self.positions.get(tuple(context[len(context) - n:]))
            if not found:
                continue
            starts = [p for p in reversed(found) if p < end and buf[p] != SEPARATOR][:max_rows]
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
