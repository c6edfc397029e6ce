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

import shutil
import sys
from pathlib import Path
from typing import Iterable

import numpy as np

from ...io.atomic import new_build_dir
from ...errors import SpecdecError
from .. import format as fmt

KIND = "trigram"
ARRAYS = {"keys": np.int64, "offsets": np.int64, "next_ids": np.int32, "counts": np.float32}
CHUNK_TRIGRAMS = 8_000_000  # distinct-trigram counting is done in chunks of this many trigrams

Row = tuple[list[int], list[float]]  # next token ids and their weights, heaviest first


# ----------------------------------------------------------------------------------------------- building


def build_trigram_datastore(token_docs: Iterable, out_dir, *, fingerprint: str, vocab_size: int,
                            progress: bool = True, meta: dict | None = None, top_k: int = 12
                            ) -> fmt.BuildSummary:
    """Count the tri-grams of tokenized documents, keep the ``top_k`` next tokens per context, write a store.

    Tri-grams never span two documents. ``meta`` (corpus, model, ...) is recorded in the manifest. Returns its
    summary (``details``: contexts, entries, distinct tri-grams, top_k).
    """
    check_vocab(vocab_size)
    if top_k < 1:
        raise SpecdecError(f"top_k must be >= 1, got {top_k}")
    keys3, counts, docs, tokens = count_trigrams(token_docs, vocab_size, progress)
    keys, offsets, next_ids, row_counts = prune_top_k(keys3, counts, vocab_size, top_k)
    arrays = {"keys": keys, "offsets": offsets, "next_ids": next_ids, "counts": row_counts}
    extra = {"top_k": top_k, "num_documents": docs, "num_tokens": tokens, "distinct_trigrams": int(keys3.size)}
    write_store(out_dir, arrays, fingerprint=fingerprint, vocab_size=vocab_size, extra={**(meta or {}), **extra})
    return fmt.BuildSummary(KIND, int(tokens), int(docs), 0, store_bytes(out_dir),
                            {"contexts": int(keys.size), "entries": int(next_ids.size),
                             "distinct_trigrams": int(keys3.size), "top_k": top_k})


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
    tmp = new_build_dir(out)
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
    """The shared manifest checks, plus: all four arrays are listed, the vocabulary fits the packed keys and
    ``top_k`` (if present) is a positive whole number."""
    manifest = fmt.read_manifest(folder, KIND)
    missing = [f"{name}.npy" for name in ARRAYS if f"{name}.npy" not in manifest["files"]]
    if missing:
        raise SpecdecError(f"datastore {folder}: the manifest lists no {', '.join(missing)}; rebuild it")
    if manifest["vocab_size"] ** 3 >= 2 ** 63:
        raise SpecdecError(f"datastore {folder}: {fmt.MANIFEST} has vocab_size = {manifest['vocab_size']}; "
                           f"too large for a tri-gram store")
    top_k = manifest.get("top_k", 12)
    if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1:
        raise SpecdecError(f"datastore {folder}: {fmt.MANIFEST} has top_k = {fmt._show(top_k)}; expected a positive "
                           f"whole number")
    return manifest


def load_arrays(folder: Path) -> dict[str, np.ndarray]:
    arrays = {name: fmt.load_npy(folder, f"{name}.npy") for name in ARRAYS}
    for name, dtype in ARRAYS.items():
        if arrays[name].dtype != dtype or arrays[name].ndim != 1:
            raise SpecdecError(f"datastore {folder} is corrupt ({name}.npy: not a 1-D {np.dtype(dtype).name} array); "
                               f"rebuild it")
    return arrays


CHUNK = 1 << 22  # entries per vectorised pass of the checks at load (bounds their temporaries)


def _chunks(array: np.ndarray, overlap: int = 0):
    """Consecutive chunks of a memory map as in-memory arrays; each starts ``overlap`` entries before its start."""
    for start in range(0, array.size, CHUNK):
        yield np.asarray(array[max(start - overlap, 0): start + CHUNK])


def structure_problem(a: dict[str, np.ndarray], vocab_size: int) -> tuple[str, str] | None:
    """Full checks, one vectorised pass over each array: ``(file, problem)`` or None. CSR invariants (one more
    offset than keys, starting at 0, non-decreasing, ending at the entry count), next ids inside the vocabulary,
    counts finite and non-negative, keys strictly increasing and inside ``[0, V * V)``. With these every row
    lookup stays inside the arrays and every drafted id is a token id."""
    keys, offsets, next_ids, counts = a["keys"], a["offsets"], a["next_ids"], a["counts"]
    if offsets.size != keys.size + 1 or next_ids.size != counts.size:
        return "offsets.npy", "sizes of the arrays do not agree"
    if offsets[0] != 0 or offsets[-1] != next_ids.size:
        return "offsets.npy", "row offsets do not span the entries"
    if any(bool((np.diff(part) < 0).any()) for part in _chunks(offsets, 1)):
        return "offsets.npy", "row offsets decrease"
    if any(int(part.min()) < 0 or int(part.max()) >= vocab_size for part in _chunks(next_ids)):
        return "next_ids.npy", "token ids outside the vocabulary"
    if any(not bool(((part >= 0) & (part <= np.finfo(np.float32).max)).all()) for part in _chunks(counts)):
        return "counts.npy", "counts that are negative, infinite or not a number"
    if any(bool((np.diff(part) <= 0).any()) for part in _chunks(keys, 1)):
        return "keys.npy", "keys are not sorted"
    if keys.size and (int(keys[0]) < 0 or int(keys[-1]) >= vocab_size * vocab_size):
        return "keys.npy", "keys outside the vocabulary"
    return None


def check_structure(folder: Path, a: dict[str, np.ndarray], vocab_size: int) -> None:
    problem = structure_problem(a, vocab_size)
    if problem:
        name, what = problem
        raise SpecdecError(f"datastore {folder} is corrupt ({name}: {what}); rebuild it, or check it with "
                           f"`specdec build-datastore --kind trigram --verify --out {folder}`")
