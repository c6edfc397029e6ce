"""Build a suffix-array datastore: token documents -> byte shards -> libdivsufsort -> token-aligned suffixes.

libdivsufsort's int32 output is only valid below 2**31 bytes, so the corpus is cut into shards below
``shard_bytes``; each shard has its own data and suffix array and retrieval searches all of them. Everything
is written into a temp directory next to ``out`` and moved into place at the end, manifest last, so an
interrupted build never leaves something that looks like a valid datastore.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from ..errors import SpecdecError
from . import format as fmt

MAX_SHARD_BYTES = 2**31 - 1 - 2**20  # int32 suffix arrays; a little headroom


def shard_token_chunks(docs: Iterable[list[int]], width: int, shard_bytes: int) -> Iterator[list[list[int]]]:
    """Group documents into shards of at most ``shard_bytes`` bytes, each document followed by a separator.

    A document longer than a whole shard is cut into pieces (its matches then stop at the cut).
    """
    max_tokens = shard_bytes // width - 1
    if max_tokens < 1:
        raise SpecdecError(f"shard size {shard_bytes} bytes is too small for {width}-byte tokens")
    shard: list[list[int]] = []
    used = 0
    for doc in docs:
        for start in range(0, len(doc), max_tokens):
            piece = doc[start:start + max_tokens]
            if shard and used + len(piece) + 1 > max_tokens + 1:
                yield shard
                shard, used = [], 0
            shard.append(piece)
            used += len(piece) + 1
    if shard:
        yield shard


def shard_bytes_array(docs: list[list[int]], width: int) -> np.ndarray:
    """Concatenate documents with a separator after each, as a writable 1-D uint8 array (divsufsort's input)."""
    sep = np.array([fmt.separator(width)], dtype=np.uint32)
    parts = [part for doc in docs for part in (np.asarray(doc, dtype=np.uint32), sep)]
    return np.ascontiguousarray(fmt.encode_tokens(np.concatenate(parts), width))


def aligned_suffixes(data: np.ndarray, width: int) -> np.ndarray:
    """Byte suffix array restricted to token starts (offset % width == 0) that are not separators (int32)."""
    from pydivsufsort import divsufsort

    if data.size >= 2**31:
        raise SpecdecError(f"shard of {data.size} bytes is too large for an int32 suffix array")
    sa = np.asarray(divsufsort(data))
    sa = sa[sa % width == 0]
    is_sep = np.ones(sa.shape, dtype=bool)
    for k in range(width):
        is_sep &= data[sa + k] == 0xFF
    return sa[~is_sep].astype(np.int32)


def _progress(iterable, desc: str, unit: str, enabled: bool, total=None):
    if not enabled:
        return iterable
    from tqdm import tqdm

    return tqdm(iterable, desc=desc, unit=unit, total=total, leave=False, dynamic_ncols=True)


def _count_tokens(docs: Iterable[list[int]], counter: dict, bar) -> Iterator[list[int]]:
    for doc in docs:
        counter["tokens"] += len(doc)
        counter["documents"] += 1
        if bar is not None:
            bar.update(len(doc))
        yield doc


def build_suffix_array_datastore(docs: Iterable[list[int]], out: str | Path, *, tokenizer_fingerprint: str,
                                 vocab_size: int, shard_bytes: int = MAX_SHARD_BYTES, progress: bool = True,
                                 meta: dict | None = None) -> dict:
    """Write a datastore for token documents ``docs`` to ``out``; returns the manifest.

    ``meta`` (corpus, model, ...) is recorded in the manifest for humans; only the fingerprint is checked.
    """
    out = Path(out)
    width = fmt.token_width(vocab_size)
    shard_bytes = min(shard_bytes, MAX_SHARD_BYTES)
    tmp = fmt.new_build_dir(out)
    t0 = time.perf_counter()
    counter = {"tokens": 0, "documents": 0}
    try:
        bar = _progress(None, "tokenizing", "tok", progress) if progress else None
        counted = _count_tokens(docs, counter, bar)
        shards = []
        for index, shard_docs in enumerate(shard_token_chunks(counted, width, shard_bytes)):
            shards.append(_write_shard(tmp, index, shard_docs, width, progress))
        if bar is not None:
            bar.close()
        if not counter["tokens"]:
            raise SpecdecError("the corpus yielded no tokens; nothing to index")
        files = {name: fmt.file_entry(tmp / name) for shard in shards for name in (shard["data"], shard["sa"])}
        manifest = {
            "format": fmt.FORMAT, "kind": fmt.KIND, "format_version": fmt.FORMAT_VERSION,
            "tokenizer_fingerprint": tokenizer_fingerprint, "vocab_size": int(vocab_size), "token_width": width,
            "separator": fmt.separator(width), "byte_order": "big", "num_tokens": counter["tokens"],
            "num_documents": counter["documents"], "num_suffixes": sum(s["suffixes"] for s in shards),
            "shards": shards, "files": files, "build_seconds": round(time.perf_counter() - t0, 3),
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **(meta or {}),
        }
        fmt.write_manifest(tmp, manifest)
        fmt.move_into_place(tmp, out)
        return manifest
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _write_shard(folder: Path, index: int, docs: list[list[int]], width: int, progress: bool) -> dict:
    data = shard_bytes_array(docs, width)
    if progress:
        from tqdm import tqdm

        tqdm.write(f"sorting shard {index}: {data.size / 1e6:.1f} MB, {len(docs)} documents")
    sa = aligned_suffixes(data, width)
    names = {"data": f"shard-{index:05d}.data.npy", "sa": f"shard-{index:05d}.sa.npy"}
    np.save(folder / names["data"], data)
    np.save(folder / names["sa"], sa)
    return {**names, "bytes": int(data.size), "tokens": int(data.size // width), "suffixes": int(sa.size),
            "documents": len(docs)}
