"""Build a suffix-array datastore: token documents -> byte shards -> libdivsufsort -> token-aligned suffixes.

libdivsufsort's int32 output is only valid below 2**31 bytes, so the corpus is cut into shards below
``shard_bytes``; each shard has its own data and suffix array and retrieval searches all of them. Everything
is written into a temp directory next to ``out`` and moved into place at the end, manifest last, so an
interrupted build never leaves something that looks like a valid datastore.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from typing import Iterable

import numpy as np

from ...io.atomic import new_build_dir
from ...errors import SpecdecError
from .. import format as fmt
from . import search

MAX_SHARD_BYTES = 2**31 - 1 - 2**20  # int32 suffix arrays; a little headroom
DEFAULT_SHARD_BYTES = 64 * 10**6  # sorting a shard needs ~6x its size: with the tokenizer workers a build stays near 1.5 GB


def _shard_tokens(width: int, shard_bytes: int) -> int:
    max_tokens = shard_bytes // width - 1
    if max_tokens < 1:
        raise SpecdecError(f"shard size {shard_bytes} bytes is too small for {width}-byte tokens")
    return max_tokens


class ByteBuffer:
    """A shard's token bytes, grown in place: each document is encoded and appended (with its separator) as it
    arrives, so a shard costs ``width`` bytes per token while it fills, not a Python list per document."""

    def __init__(self, width: int, capacity: int = 1 << 20):
        self.width = width
        self.data = np.empty(capacity, dtype=np.uint8)
        self.size = 0
        self.documents = 0
        self.sep = fmt.encode_tokens([fmt.separator(width)], width)

    def tokens(self) -> int:
        return self.size // self.width

    def add(self, ids) -> None:
        encoded = fmt.encode_tokens(np.asarray(ids, dtype=np.uint32), self.width)
        need = self.size + encoded.size + self.sep.size
        if need > self.data.size:
            grown = np.empty(max(need, 2 * self.data.size), dtype=np.uint8)
            grown[: self.size] = self.data[: self.size]
            self.data = grown
        self.data[self.size: self.size + encoded.size] = encoded
        self.data[self.size + encoded.size: need] = self.sep
        self.size = need
        self.documents += 1

    def array(self) -> np.ndarray:
        """The bytes: a writable, contiguous view of the buffer (no copy; untouched capacity costs no memory)."""
        return self.data[: self.size]


ALIGN_CHUNK = 1 << 22  # suffix-array entries filtered per pass (bounds the temporaries)


def aligned_suffixes(data: np.ndarray, width: int, documents: int | None = None) -> np.ndarray:
    """Byte suffix array restricted to token starts (offset % width == 0) that are not separators (int32).

    A separator is the largest token value, so after the alignment filter the separator suffixes are exactly the
    last ``documents`` entries (one separator per document): dropped without reading the data again. The filter
    runs in chunks into a preallocated array, so the peak is the data, the byte suffix array and the result:
    ``width + 4 * width + 4`` bytes per token.
    """
    from pydivsufsort import divsufsort

    if data.size >= 2**31:
        raise SpecdecError(f"shard of {data.size} bytes is too large for an int32 suffix array")
    sa = divsufsort(data)
    out = np.empty(data.size // width, dtype=np.int32)
    kept = 0
    for start in range(0, sa.size, ALIGN_CHUNK):
        part = sa[start: start + ALIGN_CHUNK]
        part = part[part % width == 0]
        out[kept: kept + part.size] = part
        kept += part.size
    del sa
    if documents is None:  # count separators the slow way (callers that do not know)
        tokens = fmt.decode_tokens(data, width)
        documents = int((tokens == fmt.separator(width)).sum())
    return out[: kept - documents]


def _progress(iterable, desc: str, unit: str, enabled: bool, total=None):
    if not enabled:
        return iterable
    from tqdm import tqdm

    return tqdm(iterable, desc=desc, unit=unit, total=total, leave=False, dynamic_ncols=True)


def build_suffix_array_datastore(docs: Iterable, out: str | Path, *, fingerprint: str, vocab_size: int,
                                 progress: bool = True, meta: dict | None = None, shard_bytes: int = MAX_SHARD_BYTES,
                                 token_bar: bool = True) -> fmt.BuildSummary:
    """Write a datastore for token documents ``docs`` to ``out``; returns its summary (``details``: suffixes).

    ``meta`` (corpus, model, ...) is recorded in the manifest for humans; only the fingerprint is checked.
    """
    out = Path(out)
    width = fmt.token_width(vocab_size)
    max_tokens = _shard_tokens(width, min(shard_bytes, MAX_SHARD_BYTES))
    tmp = new_build_dir(out)
    t0 = time.perf_counter()
    counter = {"tokens": 0, "documents": 0}
    try:
        bar = _progress(None, "tokenizing", "tok", progress) if progress and token_bar else None
        shards: list[dict] = []
        capacity = (max_tokens + 1) * width  # reserved, not touched: pages cost memory only once written
        buf = ByteBuffer(width, capacity)
        for doc in docs:
            counter["tokens"] += len(doc)
            counter["documents"] += 1
            if bar is not None:
                bar.update(len(doc))
            for start in range(0, len(doc), max_tokens):  # a document longer than a shard is cut into pieces
                piece = doc[start:start + max_tokens]
                if buf.documents and buf.tokens() + len(piece) + 1 > max_tokens + 1:
                    shards.append(_write_shard(tmp, len(shards), buf, progress))
                    buf = ByteBuffer(width, capacity)
                buf.add(piece)
        if buf.documents:
            shards.append(_write_shard(tmp, len(shards), buf, progress))
        if bar is not None:
            bar.close()
        if not counter["tokens"]:
            raise SpecdecError("the corpus yielded no tokens; nothing to index")
        files = {name: fmt.file_entry(tmp / name) for shard in shards for name in (shard["data"], shard["sa"], shard["keys"])}
        manifest = {
            "format": fmt.FORMAT, "kind": fmt.KIND, "format_version": fmt.FORMAT_VERSION,
            "tokenizer_fingerprint": fingerprint, "vocab_size": int(vocab_size), "token_width": width,
            "separator": fmt.separator(width), "byte_order": "big", "num_tokens": counter["tokens"],
            "num_documents": counter["documents"], "num_suffixes": sum(s["suffixes"] for s in shards),
            "shards": shards, "files": files, "build_seconds": round(time.perf_counter() - t0, 3),
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **(meta or {}),
        }
        fmt.write_manifest(tmp, manifest)
        fmt.move_into_place(tmp, out)
        return fmt.BuildSummary.of(out, manifest, suffixes=manifest["num_suffixes"])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _write_shard(folder: Path, index: int, buf: ByteBuffer, progress: bool) -> dict:
    data = buf.array()
    if progress:
        from tqdm import tqdm

        tqdm.write(f"sorting shard {index}: {data.size / 1e6:.1f} MB, {buf.documents} documents", file=sys.stderr)
    sa = aligned_suffixes(data, buf.width, buf.documents)
    names = {"data": f"shard-{index:05d}.data.npy", "sa": f"shard-{index:05d}.sa.npy",
             "keys": f"shard-{index:05d}.keys.npy"}
    np.save(folder / names["data"], data)
    np.save(folder / names["sa"], sa)
    np.save(folder / names["keys"], search.sample_keys(data, sa, search.KEY_STRIDE))
    return {**names, "key_stride": search.KEY_STRIDE, "bytes": int(data.size), "tokens": int(data.size // buf.width),
            "suffixes": int(sa.size), "documents": buf.documents}
