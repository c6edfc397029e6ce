"""Prompt lookup's match (Saxena 2023; transformers' ``prompt_lookup_num_tokens``): the continuation of the first
(leftmost) earlier occurrence of the longest tail n-gram -- by a scan (:func:`lookup`) or by an index updated with
the new tokens only (:class:`FirstOccurrenceIndex`). ``pld`` drafts with it and ``rest`` with its context."""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


def lookup(tokens: list[int], max_ngram: int = 3, num_pred: int = 10, min_ngram: int = 1) -> list[int]:
    """The continuation of the first (leftmost) earlier match of the longest matching tail n-gram.

    Like transformers' ``PromptLookupCandidateGenerator``: matches are scanned left to right and the first
    one with at least one following token wins; the copy stops at the end of the sequence.
    """
    return lookup_match(tokens, max_ngram, num_pred, min_ngram)[0]


def lookup_match(tokens: list[int], max_ngram: int = 3, num_pred: int = 10, min_ngram: int = 1
                 ) -> tuple[list[int], int]:
    """:func:`lookup`, and the length of the n-gram that matched (0: none)."""
    arr = np.asarray(tokens, dtype=np.int64)
    length = arr.size
    for size in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        windows = sliding_window_view(arr, size)
        hits = np.flatnonzero((windows == arr[-size:]).all(axis=1))
        for idx in hits:
            start = int(idx) + size
            end = min(start + num_pred, length)
            if start < end:
                return arr[start:end].tolist(), size
    return [], 0


class FirstOccurrenceIndex:
    """First occurrence of every n-gram (n <= ``max_ngram``) of a growing sequence, updated with the new tokens
    only: :func:`lookup` in O(new tokens) per step instead of a scan of the whole sequence (vLLM's and
    SuffixDecoding's point for long prompts). Used while the engine keeps extending the same token list; any
    other list is indexed afresh."""

    def __init__(self, max_ngram: int):
        self.max_ngram = max_ngram
        self.first: dict[tuple[int, ...], int] = {}
        self.source: list[int] | None = None
        self.prefix: list[int] | None = None  # indexed by prepare(), waiting for the list that extends it
        self.indexed = 0

    def prepare(self, prompt: list[int]) -> None:
        """Index the prompt ahead of the first step (the engine's token list is adopted if it starts with it)."""
        self.update(prompt)
        self.source, self.prefix = None, list(prompt)

    def update(self, tokens: list[int]) -> None:
        if tokens is not self.source or len(tokens) < self.indexed:
            adopt = self.source is None and self.prefix is not None and tokens[: len(self.prefix)] == self.prefix
            if not adopt:  # another sequence: index it afresh
                self.first, self.indexed = {}, 0
            self.source, self.prefix = tokens, None
        first, n = self.first, self.max_ngram
        for i in range(self.indexed, len(tokens)):  # n-grams ending at i
            for size in range(1, min(n, i + 1) + 1):
                first.setdefault(tuple(tokens[i - size + 1: i + 1]), i - size + 1)
        self.indexed = len(tokens)

    def lookup(self, tokens: list[int], num_pred: int, min_ngram: int = 1) -> tuple[list[int], int]:
        """The same answer as :func:`lookup_match`: the leftmost earlier occurrence of the longest tail n-gram."""
        self.update(tokens)
        length = len(tokens)
        for size in range(min(self.max_ngram, length - 1), min_ngram - 1, -1):
            start = self.first.get(tuple(tokens[length - size:]))
            if start is not None and start + size < length:
                return tokens[start + size: min(start + size + num_pred, length)], size
        return [], 0
