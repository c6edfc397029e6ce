"""Building a datastore from a corpus: read, tokenize (worker processes), index, report.

The library side of ``specdec build-datastore``: :func:`build` streams the corpus's documents through the
model's tokenizer into the builder of the asked kind (``KINDS``) and returns the JSON summary the command prints.
"""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path

from ..io.corpora import iter_documents
from ..errors import SpecdecError
from . import DEFAULT_KIND, KINDS
from .suffix_array.build import DEFAULT_SHARD_BYTES
from .format import BuildSummary, check_out_dir
from ..runtime.machine import peak_rss_bytes
from .tokenizing.tokenize import ParallelTokenizer, tokenizer_info


def build(corpus: str, model: str, out: str, *, kind: str = DEFAULT_KIND, max_tokens: int | None = None,
          max_docs: int | None = None, shard_bytes: int | None = None, progress: bool = True,
          workers: int | None = None) -> dict:
    """Tokenize ``corpus`` with ``model``'s tokenizer and build a ``kind`` datastore in ``out``; returns a short
    summary (tokens, seconds, bytes per token, peak memory of the whole pipeline)."""
    if kind not in KINDS:
        raise SpecdecError(f"unknown --kind {kind!r}; choose {' or '.join(KINDS)}")
    check_out_dir(Path(out))  # refuse to replace a folder that is not a datastore before any work
    texts = iter_documents(corpus, max_docs)
    first = next(texts, None)  # corpus problems (unknown name, offline hub) surface before the tokenizer loads
    if first is None:
        raise SpecdecError(f"corpus {corpus!r} holds no documents")
    t0 = time.perf_counter()
    texts = _reading_bar(itertools.chain([first], texts), corpus, progress)
    fingerprint, vocab_size, docs, pool = _token_documents(model, texts, max_tokens, workers or os.cpu_count() or 1)
    meta = {"corpus": corpus, "model": model, "max_tokens": max_tokens, "max_docs": max_docs}
    options = {"shard_bytes": shard_bytes or DEFAULT_SHARD_BYTES, "token_bar": False}
    options = {k: v for k, v in options.items() if k in KINDS[kind].build_options}
    try:
        built = KINDS[kind].build(docs, out, fingerprint=fingerprint, vocab_size=vocab_size, meta=meta,
                                  progress=progress, **options)
    except OSError as err:  # disk full, quota, a read-only folder: the half-built folder is already removed
        reason = err.strerror or str(err)
        if err.errno is None and "requested" in reason and "written" in reason:
            reason = "a write was cut short (disk full?)"
        raise SpecdecError(f"cannot write the datastore {out}: {reason}") from None
    finally:
        docs.close()  # stops the tokenizer workers at once when the build ends early (error, Ctrl-C)
    seconds = time.perf_counter() - t0
    return _summary(Path(out), built, seconds, pool.peak_rss_bytes() if pool else 0)


def _reading_bar(texts, corpus: str, enabled: bool):
    """The corpus's documents, with a progress bar on stderr over its size (total and ETA for local corpora)."""
    if not enabled:
        yield from texts
        return
    import sys

    from tqdm import tqdm

    from ..io.corpora import corpus_bytes

    with tqdm(total=corpus_bytes(corpus), unit="B", unit_scale=True, desc="tokenizing", file=sys.stderr,
              leave=False, dynamic_ncols=True) as bar:
        for text in texts:
            bar.update(len(text))
            yield text


def _token_documents(model: str, texts, max_tokens: int | None, workers: int):
    """``(fingerprint, vocab size, token documents, worker pool or None)``: tokenized by worker processes when
    the model's tokenizer has an exact Rust backend, else in this process."""
    from ..io.corpora import tokenize_documents

    info = tokenizer_info(model)
    if info["backend"] is not None:
        pool = ParallelTokenizer(info["backend"], workers, info.get("replace"), info.get("pieces"))
        return info["fingerprint"], info["vocab_size"], pool.documents(texts, max_tokens), pool
    from ..io.models import load_tokenizer

    os.environ["TOKENIZERS_PARALLELISM"] = "true"  # batches are tokenized on every core (in Rust)
    return info["fingerprint"], info["vocab_size"], tokenize_documents(load_tokenizer(model), texts, max_tokens), None


def _summary(out: Path, built: BuildSummary, seconds: float, workers_rss: int = 0) -> dict:
    """The JSON line ``build-datastore`` prints, from the builder's summary (one shape for every kind).
    ``peak_rss_bytes`` counts this process and the tokenizer workers together (they run at the same time)."""
    tokens, size = built.tokens, built.bytes
    main = peak_rss_bytes()
    peak = main + workers_rss
    return {"out": str(out), "kind": built.kind, "tokens": tokens, "documents": built.documents,
            "shards": built.shards, "bytes": size, "seconds": round(seconds, 2),
            "bytes_per_token": round(size / tokens, 3) if tokens else None,
            "seconds_per_million_tokens": round(seconds / tokens * 1e6, 2) if tokens else None,
            "peak_rss_bytes": peak, "peak_rss_main_bytes": main, "peak_rss_workers_bytes": workers_rss,
            "peak_rss_bytes_per_token": round(peak / tokens, 2) if tokens else None}
