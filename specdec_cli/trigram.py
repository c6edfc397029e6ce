"""The tri-gram matrix of ADED (Liu et al.): ``P(c | a, b)`` from corpus counts, pruned to the top-k per context.

On disk (a directory in the shared specdec datastore layout of ``datastore/format.py``: written into a temporary
sibling and moved into place with ``os.replace``)::

    keys.npy      int64   [C]      sorted context keys ``a * V + b``
    offsets.npy   int64   [C + 1]  CSR row offsets into the two arrays below
    next_ids.npy  int32   [E]      next tokens of each context, most frequent first
    counts.npy    float32 [E]      their counts (float so that an adapted matrix can be saved in the same format)
    manifest.json                  format "specdec-datastore", kind "trigram", format version, tokenizer
                                   fingerprint, vocab size, sizes and sha256s; written last, so a half-written
                                   store has no manifest

Loading memory-maps the arrays. :class:`TrigramMatrix` adds an in-memory *overlay* of adapted rows (ADED's
Algorithm 2) on top of the read-only base; :meth:`TrigramMatrix.save` merges both into a new store.
"""

from __future__ import annotations

import itertools
import shutil
import sys
from pathlib import Path
from typing import Iterable

import numpy as np

from .datastore import format as fmt
from .errors import SpecdecError

KIND = "trigram"
ARRAYS = {"keys": np.int64, "offsets": np.int64, "next_ids": np.int32, "counts": np.float32}
CHUNK_TRIGRAMS = 8_000_000  # distinct-trigram counting is done in chunks of this many trigrams

Row = tuple[list[int], list[float]]  # next token ids and their weights, heaviest first


# ----------------------------------------------------------------------------------------------- building


def build_trigram_datastore(token_docs: Iterable[list[int]], out_dir, fingerprint: str, vocab_size: int, *,
                            top_k: int = 12, progress: bool = True, meta: dict | None = None) -> dict:
    """Count the tri-grams of tokenized documents, keep the ``top_k`` next tokens per context, write a store.

    Tri-grams never span two documents. ``meta`` (corpus, model, ...) is recorded in the manifest. Returns
    statistics: documents, tokens, contexts, entries, bytes (plus ``kind`` / ``num_tokens`` / ``num_documents``,
    the names the suffix-array builder's manifest uses, for ``build-datastore``'s summary).
    """
    check_vocab(vocab_size)
    if top_k < 1:
        raise SpecdecError(f"top_k must be >= 1, got {top_k}")
    keys3, counts, docs, tokens = count_trigrams(token_docs, vocab_size, progress)
    keys, offsets, next_ids, row_counts = prune_top_k(keys3, counts, vocab_size, top_k)
    arrays = {"keys": keys, "offsets": offsets, "next_ids": next_ids, "counts": row_counts}
    extra = {"top_k": top_k, "num_documents": docs, "num_tokens": tokens, "distinct_trigrams": int(keys3.size)}
    write_store(out_dir, arrays, fingerprint=fingerprint, vocab_size=vocab_size, extra={**(meta or {}), **extra})
    stats = {**extra, "documents": docs, "tokens": tokens, "contexts": int(keys.size), "entries": int(next_ids.size),
             "bytes": store_bytes(out_dir)}
    if progress:
        print(f"trigram store: {stats}", file=sys.stderr)
    return {**stats, "kind": KIND}


def check_vocab(vocab_size: int) -> None:
    """A tri-gram is packed as ``(a * V + b) * V + c`` in an int64, so ``V**3`` must fit."""
    if vocab_size < 1 or vocab_size ** 3 >= 2 ** 63:
        raise SpecdecError(f"vocabulary of {vocab_size} ids is out of range for a tri-gram store")


def doc_trigram_keys(ids, vocab_size: int) -> np.ndarray:
    """Packed tri-gram keys of one document (empty for fewer than 3 tokens)."""
    arr = np.asarray(ids, dtype=np.int64)
    if arr.size < 3:
        return np.empty(0, dtype=np.int64)
    if arr.min() < 0 or arr.max() >= vocab_size:
        raise SpecdecError(f"token id out of range [0, {vocab_size}) in a document")
    return (arr[:-2] * vocab_size + arr[1:-1]) * vocab_size + arr[2:]


def merge_counts(keys: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sum the counts of equal keys; returns sorted distinct keys and their totals."""
    uniq, inverse = np.unique(keys, return_inverse=True)
    return uniq, np.bincount(inverse, weights=counts, minlength=uniq.size).astype(np.int64)


def count_trigrams(token_docs: Iterable[list[int]], vocab_size: int, progress: bool
                   ) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Distinct packed tri-grams and their counts, counted chunk by chunk to bound memory."""
    total_keys = np.empty(0, dtype=np.int64)
    total_counts = np.empty(0, dtype=np.int64)
    pending: list[np.ndarray] = []
    pending_n = docs = tokens = 0

    def flush():
        nonlocal total_keys, total_counts, pending, pending_n
        if not pending:
            return
        chunk = np.concatenate(pending)
        k, c = np.unique(chunk, return_counts=True)
        total_keys, total_counts = merge_counts(np.concatenate([total_keys, k]), np.concatenate([total_counts, c]))
        pending, pending_n = [], 0

    for ids in token_docs:
        docs += 1
        tokens += len(ids)
        keys = doc_trigram_keys(ids, vocab_size)
        if keys.size:
            pending.append(keys)
            pending_n += keys.size
        if pending_n >= CHUNK_TRIGRAMS:
            flush()
            if progress:
                print(f"trigram: {docs} documents, {tokens} tokens, {total_keys.size} distinct", file=sys.stderr)
    flush()
    return total_keys, total_counts, docs, tokens


def prune_top_k(keys3: np.ndarray, counts: np.ndarray, vocab_size: int, top_k: int
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Group sorted tri-grams by context, keep each context's ``top_k`` most frequent next tokens (CSR arrays).

    Ties keep the smaller token id, so the store is deterministic.
    """
    ctx = keys3 // vocab_size
    nxt = keys3 % vocab_size
    order = np.lexsort((nxt, -counts, ctx))  # by context, then count descending, then token id
    ctx, nxt, counts = ctx[order], nxt[order], counts[order]
    starts = np.flatnonzero(np.r_[True, ctx[1:] != ctx[:-1]]) if ctx.size else np.empty(0, dtype=np.int64)
    group_start = np.repeat(starts, np.diff(np.r_[starts, ctx.size]))
    keep = (np.arange(ctx.size) - group_start) < top_k
    ctx, nxt, counts = ctx[keep], nxt[keep], counts[keep]
    keys, row_sizes = np.unique(ctx, return_counts=True)
    offsets = np.r_[0, np.cumsum(row_sizes)].astype(np.int64)
    return keys.astype(np.int64), offsets, nxt.astype(np.int32), counts.astype(np.float32)


# ------------------------------------------------------------------------------------------------ on disk


def store_bytes(out_dir) -> int:
    """Size of a store directory on disk (all its files)."""
    return sum(p.stat().st_size for p in Path(out_dir).iterdir() if p.is_file())


def write_store(out_dir, arrays: dict[str, np.ndarray], *, fingerprint: str, vocab_size: int, extra: dict) -> None:
    """Write the arrays and (last) the manifest into a temporary sibling directory, then move it into place."""
    out = Path(out_dir)
    tmp = fmt.new_build_dir(out)
    try:
        for name, dtype in ARRAYS.items():
            np.save(tmp / f"{name}.npy", np.ascontiguousarray(arrays[name], dtype=dtype))
        files = {f"{name}.npy": fmt.file_entry(tmp / f"{name}.npy") for name in ARRAYS}
        manifest = {"format": fmt.FORMAT, "kind": KIND, "format_version": fmt.VERSIONS[KIND],
                    "tokenizer_fingerprint": fingerprint, "vocab_size": int(vocab_size),
                    "contexts": int(arrays["keys"].size), "entries": int(arrays["next_ids"].size), **extra,
                    "files": files}
        fmt.write_manifest(tmp, manifest)
        fmt.move_into_place(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def read_manifest(folder: Path) -> dict:
    """The shared manifest checks, plus: all four arrays are listed."""
    manifest = fmt.read_manifest(folder, KIND)
    missing = [f"{name}.npy" for name in ARRAYS if f"{name}.npy" not in manifest["files"]]
    if missing:
        raise SpecdecError(f"datastore {folder}: the manifest lists no {', '.join(missing)}; rebuild it")
    return manifest


def load_arrays(folder: Path) -> dict[str, np.ndarray]:
    try:
        arrays = {name: np.load(folder / f"{name}.npy", mmap_mode="r") for name in ARRAYS}
    except (OSError, ValueError) as err:
        raise SpecdecError(f"{folder}: unreadable tri-gram array ({err})") from None
    for name, dtype in ARRAYS.items():
        if arrays[name].dtype != dtype or arrays[name].ndim != 1:
            raise SpecdecError(f"{folder}: {name}.npy has the wrong type {arrays[name].dtype}")
    return arrays


def check_structure(folder: Path, a: dict[str, np.ndarray]) -> None:
    """CSR invariants: one more offset than keys, offsets non-decreasing and ending at the entry count."""
    keys, offsets, next_ids = a["keys"], a["offsets"], a["next_ids"]
    ok = (offsets.size == keys.size + 1 and next_ids.size == a["counts"].size and offsets[0] == 0
          and offsets[-1] == next_ids.size and bool(np.all(np.diff(offsets) >= 0)))
    if not ok:
        raise SpecdecError(f"{folder}: tri-gram store is inconsistent (CSR offsets); rebuild it")


# ------------------------------------------------------------------------------------------------ the matrix


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
        self._cumulative: dict[int, Row] = {}
        self._overlay_keys: np.ndarray | None = None

    @classmethod
    def load(cls, folder, expected_fingerprint: str | None = None, *, verify_checksums: bool = True
             ) -> "TrigramMatrix":
        """Open a store; raises :class:`SpecdecError` for another tokenizer or a corrupt/truncated store."""
        folder = Path(folder)
        manifest = read_manifest(folder)
        got = manifest["tokenizer_fingerprint"]
        if expected_fingerprint is not None:
            fmt.check_tokenizer(folder, manifest, expected_fingerprint)
        fmt.check_files(folder, manifest, verify_checksums)
        arrays = load_arrays(folder)
        check_structure(folder, arrays)
        return cls(**arrays, vocab_size=manifest["vocab_size"], fingerprint=got, top_k=manifest.get("top_k", 12),
                   meta=manifest)

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

    def cumulative(self, a: int, b: int) -> tuple[list[int], list[float]]:
        """Next tokens after ``(a, b)`` and their cumulative probabilities (for sampling by bisection)."""
        key = self.key(a, b)
        hit = self._cumulative.get(key)
        if hit is None:
            ids, ps = self.probs(a, b)
            hit = (ids, list(itertools.accumulate(ps)))
            self._cumulative[key] = hit
        return hit

    def clear_cache(self) -> None:
        self._cache.clear()
        self._cumulative.clear()

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
        self._cumulative.pop(key, None)

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
