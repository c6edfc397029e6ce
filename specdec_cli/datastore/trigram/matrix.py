"""``TrigramMatrix``: ADED's ``P(c | a, b)`` over a memory-mapped tri-gram store plus an in-memory overlay of
adapted rows (Algorithm 2); the store's format and builder are in ``trigram.py``."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import numpy as np

from .. import format as fmt
from .store import (Row, check_structure, count_trigrams, load_arrays, prune_top_k, read_manifest, store_bytes, write_store)


class TrigramMatrix:
    """Read access to ``P(c | a, b)`` over a memory-mapped base plus an in-memory overlay of adapted rows.

    A row is the list of kept next tokens of a context with non-negative weights (counts in the base; the
    overlay holds rows whose weights ADED's Algorithm 2 changed). Probabilities are weights over the row sum.
    """

    def __init__(self, keys, offsets, next_ids, counts, *, vocab_size: int, fingerprint: str = "", top_k: int = 12,
                 meta: dict | None = None):
        self.keys, self.offsets, self.next_ids, self.counts = keys, offsets, next_ids, counts
        self.vocab_size = int(vocab_size)
        self.fingerprint = fingerprint
        self.top_k = int(top_k)
        self.meta = dict(meta or {})
        self.overlay: dict[int, dict[int, float]] = {}
        self._cache: dict[int, Row] = {}
        self._overlay_keys: np.ndarray | None = None

    @classmethod
    def load(cls, folder, fingerprint: str | None = None, verify: bool = False) -> "TrigramMatrix":
        """Open a store; raises :class:`SpecdecError` for another tokenizer or a corrupt/truncated store (sizes
        and structure always checked; ``verify`` also recomputes every file's sha256)."""
        folder = Path(folder)
        manifest = read_manifest(folder)
        got = manifest["tokenizer_fingerprint"]
        if fingerprint is not None:
            fmt.check_tokenizer(folder, manifest, fingerprint)
        fmt.check_files(folder, manifest, verify)
        arrays = load_arrays(folder)
        check_structure(folder, arrays, int(manifest["vocab_size"]))
        return cls(**arrays, vocab_size=manifest["vocab_size"], fingerprint=got, top_k=manifest.get("top_k", 12),
                   meta=manifest)

    def view(self) -> "TrigramMatrix":
        """A matrix over the same (read-only, memory-mapped) base with its own overlay and caches: every drafter
        of a run adapts its own rows from one opened store."""
        return TrigramMatrix(self.keys, self.offsets, self.next_ids, self.counts, vocab_size=self.vocab_size,
                             fingerprint=self.fingerprint, top_k=self.top_k, meta=self.meta)

    @property
    def manifest(self) -> dict:
        return self.meta

    @classmethod
    def from_token_docs(cls, token_docs: Iterable[list[int]], vocab_size: int, top_k: int = 12) -> "TrigramMatrix":
        """An in-memory matrix (no files), e.g. for tests."""
        keys3, counts, _, _ = count_trigrams(token_docs, vocab_size, progress=False)
        keys, offsets, next_ids, row_counts = prune_top_k(keys3, counts, vocab_size, top_k)
        return cls(keys, offsets, next_ids, row_counts, vocab_size=vocab_size, top_k=top_k)

    def key(self, a: int, b: int) -> int:
        return int(a) * self.vocab_size + int(b)

    def base_row(self, key: int) -> Row:
        i = int(np.searchsorted(self.keys, key))
        if i >= self.keys.size or int(self.keys[i]) != key:
            return [], []
        lo, hi = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.next_ids[lo:hi].tolist(), self.counts[lo:hi].tolist()

    def gather(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The rows of many contexts at once, as CSR arrays: ``offsets [len(keys) + 1]``, next ids and
        probabilities (each row normalised; an unseen context is an empty row; the overlay's rows replace the
        base's). Vectorised over the memory-mapped base: one ``searchsorted`` for all keys."""
        keys = np.asarray(keys, dtype=np.int64)
        n = keys.size
        lengths = np.zeros(n, dtype=np.int64)
        lo = np.zeros(n, dtype=np.int64)
        if self.keys.size and n:
            idx = np.searchsorted(self.keys, keys)
            inside = np.minimum(idx, self.keys.size - 1)
            found = (idx < self.keys.size) & (np.asarray(self.keys[inside]) == keys)
            offsets = np.asarray(self.offsets)
            lo = np.where(found, offsets[inside], 0)
            lengths = np.where(found, offsets[np.minimum(inside + 1, offsets.size - 1)] - lo, 0)
        adapted = {}
        if self.overlay:
            for i in np.flatnonzero(np.isin(keys, self.overlay_keys())).tolist():
                adapted[i] = self.row_of_key(int(keys[i]))
                lengths[i] = len(adapted[i][0])
        out_offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=out_offsets[1:])
        total = int(out_offsets[-1])
        base_pos = np.repeat(lo - out_offsets[:-1], lengths) + np.arange(total, dtype=np.int64)
        if adapted:  # those rows are filled below; keep their placeholder positions inside the arrays
            np.clip(base_pos, 0, max(self.next_ids.size - 1, 0), out=base_pos)
        if total and self.next_ids.size:
            ids = np.asarray(self.next_ids)[base_pos].astype(np.int64)
            weights = np.asarray(self.counts)[base_pos].astype(np.float64)
        else:
            ids, weights = np.zeros(total, dtype=np.int64), np.zeros(total)
        for i, (row_ids, row_w) in adapted.items():
            a, b = out_offsets[i], out_offsets[i + 1]
            ids[a:b], weights[a:b] = row_ids, row_w
        sums = np.add.reduceat(weights, out_offsets[:-1][lengths > 0]) if total else np.empty(0)
        row_sum = np.zeros(n)
        row_sum[lengths > 0] = sums
        probs = weights / np.repeat(np.where(row_sum > 0, row_sum, 1.0), lengths)
        return out_offsets, ids, probs

    def overlay_keys(self) -> np.ndarray:
        if self._overlay_keys is None or self._overlay_keys.size != len(self.overlay):
            self._overlay_keys = np.fromiter(self.overlay, dtype=np.int64, count=len(self.overlay))
        return self._overlay_keys

    def row_of_key(self, key: int) -> Row:
        adapted = self.overlay.get(key)
        if adapted is None:
            return self.base_row(key)
        ranked = sorted(adapted.items(), key=lambda kv: (-kv[1], kv[0]))
        return [t for t, _ in ranked], [w for _, w in ranked]

    def row(self, a: int, b: int) -> Row:
        """Next tokens after ``(a, b)`` and their weights, heaviest first (the overlay's row replaces the base's)."""
        if not (0 <= a < self.vocab_size and 0 <= b < self.vocab_size):
            return [], []
        return self.row_of_key(self.key(a, b))

    def probs(self, a: int, b: int) -> Row:
        """``P(. | a, b)`` over the kept next tokens (Eq. 1 renormalised after pruning); empty when unseen.

        Cached per context: the MCTS asks for the same few contexts hundreds of times per draft.
        """
        key = self.key(a, b)
        hit = self._cache.get(key)
        if hit is None:
            ids, weights = self.row(a, b)
            total = sum(weights)
            hit = (ids, [w / total for w in weights]) if total > 0 else ([], [])
            self._cache[key] = hit
        return hit

    def clear_cache(self) -> None:
        self._cache.clear()

    def prob(self, a: int, b: int, c: int) -> float:
        ids, ps = self.probs(a, b)
        for t, p in zip(ids, ps):
            if t == c:
                return p
        return 0.0

    # -- Algorithm 2: adaptive update -------------------------------------------------------------------------

    def adjust(self, tokens: list[int], max_length: int | None = None, increment: float = 0.1,
               max_prob: float = 1.0) -> int:
        """ADED Algorithm 2 over the last ``max_length`` tokens; returns how many tri-grams were applied.

        Works in probability space as the paper does: an adapted row starts from the base row's probabilities;
        a seen tri-gram gains ``increment`` (capped at ``max_prob``), an unseen one enters with ``increment``.
        The row is then pruned back to the ``top_k`` heaviest entries (ties: the existing, then smaller id).
        """
        sub = tokens[-max_length:] if max_length else tokens
        n = 0
        for i in range(2, len(sub)):
            self.bump(sub[i - 2], sub[i - 1], sub[i], increment, max_prob)
            n += 1
        return n

    def bump(self, a: int, b: int, c: int, increment: float, max_prob: float) -> None:
        if not all(0 <= t < self.vocab_size for t in (a, b, c)):
            return
        key = self.key(a, b)
        row = self.overlay.get(key)
        if row is None:
            ids, ps = self.probs(a, b)
            row = dict(zip(ids, ps))
            self.overlay[key] = row
        row[c] = min(row[c] + increment, max_prob) if c in row else increment
        if len(row) > self.top_k:
            weakest = min(row.items(), key=lambda kv: (kv[1], kv[0] == c, -kv[0]))
            del row[weakest[0]]
        self._cache.pop(key, None)

    # -- checkpoints (bench --resume) --------------------------------------------------------------------------

    def overlay_state(self) -> list:
        """The adapted rows as JSON data: ``[[key, [[token, probability], ...]], ...]`` in their order."""
        return [[key, [[tok, p] for tok, p in row.items()]] for key, row in self.overlay.items()]

    def load_overlay_state(self, state: list) -> None:
        from ...io.state import count, number

        overlay: dict[int, dict[int, float]] = {}
        for key, row in state:
            key = count(key)
            if key >= self.vocab_size * self.vocab_size or len(row) > 1024:
                raise ValueError("not an adapted row of this matrix")
            entries = {}
            for tok, p in row:
                if count(tok) >= self.vocab_size:
                    raise ValueError("token id outside the vocabulary")
                entries[tok] = number(p)
            overlay[key] = entries
        self.overlay = overlay
        self._overlay_keys = None
        self.clear_cache()

    # -- saving -----------------------------------------------------------------------------------------------

    def merged_arrays(self) -> dict[str, np.ndarray]:
        """Base rows with the overlay's rows replacing theirs (weights rescaled to the base row's count total)."""
        rows: dict[int, Row] = {}
        for key, adapted in self.overlay.items():
            _, base_w = self.base_row(key)
            scale = sum(base_w) or 1.0
            ranked = sorted(adapted.items(), key=lambda kv: (-kv[1], kv[0]))
            rows[key] = ([t for t, _ in ranked], [w * scale for _, w in ranked])
        base_keys = np.asarray(self.keys, dtype=np.int64)
        keep = ~np.isin(base_keys, np.fromiter(rows, dtype=np.int64, count=len(rows)))
        sizes = np.diff(np.asarray(self.offsets))
        entry_keep = np.repeat(keep, sizes)
        new_keys = np.fromiter(rows, dtype=np.int64, count=len(rows))
        all_keys = np.concatenate([base_keys[keep], new_keys])
        all_sizes = np.concatenate([sizes[keep], [len(rows[k][0]) for k in new_keys]]).astype(np.int64)
        all_ids = np.concatenate([np.asarray(self.next_ids)[entry_keep],
                                  np.asarray([t for k in new_keys for t in rows[k][0]], dtype=np.int32)])
        all_w = np.concatenate([np.asarray(self.counts)[entry_keep],
                                np.asarray([w for k in new_keys for w in rows[k][1]], dtype=np.float32)])
        order = np.argsort(all_keys, kind="stable")
        entry_order = np.argsort(np.repeat(all_keys, all_sizes), kind="stable")  # rows stay contiguous, in order
        return {"keys": all_keys[order], "offsets": np.r_[0, np.cumsum(all_sizes[order])].astype(np.int64),
                "next_ids": all_ids[entry_order], "counts": all_w[entry_order]}

    def save(self, out_dir) -> dict:
        """Write base + overlay as a new store (same format); returns its manifest statistics."""
        arrays = self.merged_arrays()
        extra = {"top_k": self.top_k, "adapted_contexts": len(self.overlay),
                 **{k: self.meta[k] for k in ("num_documents", "num_tokens") if k in self.meta}}
        write_store(out_dir, arrays, fingerprint=self.fingerprint, vocab_size=self.vocab_size, extra=extra)
        return {**extra, "contexts": int(arrays["keys"].size), "entries": int(arrays["next_ids"].size),
                "bytes": store_bytes(out_dir)}
