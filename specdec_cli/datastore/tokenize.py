"""Tokenizing a corpus for a datastore build, on every core, in small processes.

Tokenization is most of a build's cost (Gemma-3's tokenizer: about 0.5M tokens per CPU-second), and a
transformers tokenizer costs ~500 MB of memory on top of torch. So the build process never loads one: a
short-lived child loads the model's tokenizer once to compute its fingerprint and export its Rust backend (after
checking on a sample that the backend alone gives the same ids), and ``workers`` processes that load only that
backend encode batches of documents in order. Each worker reports its own peak memory, so the
build's summary can count the whole pipeline's memory, not only the parent's.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from typing import Iterable, Iterator

import numpy as np

TASK_CHARS = 1 << 18  # text per task: large enough to amortize the hand-over, small enough to keep order cheap
PENDING_PER_WORKER = 64  # tasks queued ahead: workers keep tokenizing while the parent sorts a shard
SAMPLE = ["def f(x):\n    return x  # 42\n\n\n", "  Hello,\tworld!  \n", "naïve café — 東京 🙂", "\n\n    if a:\n\tb()",
          " leading space", "trailing space ", "x" * 300, "<s></s><pad>"]


def tokenizer_info(model: str) -> dict:
    """In a child process: the tokenizer's fingerprint and vocabulary size, and its Rust backend as JSON when that
    backend alone tokenizes exactly like the transformers tokenizer (else ``None``: tokenize in-process)."""
    with ProcessPoolExecutor(1, mp_context=_context(), initializer=_ignore_interrupts) as pool:
        return pool.submit(_tokenizer_info, model).result()


def _tokenizer_info(model: str) -> dict:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    from ..models import load_tokenizer, tokenizer_fingerprint

    tokenizer = load_tokenizer(model)
    info = {"fingerprint": tokenizer_fingerprint(tokenizer), "vocab_size": len(tokenizer), "backend": None}
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        ours = [e.ids for e in backend.encode_batch(SAMPLE, add_special_tokens=False)]
        theirs = [list(ids) for ids in tokenizer(SAMPLE, add_special_tokens=False)["input_ids"]]
        if ours == theirs:
            info["backend"] = backend.to_str()
    return info


_BACKEND = None


def _context():
    """fork where there is one (instant start, nothing to hand over, so an interrupt during start-up is clean; the
    parent holds no tokenizer or torch state to share), else spawn."""
    return mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")


def _ignore_interrupts() -> None:
    """Ctrl-C reaches the whole process group: the parent alone handles it (and shuts the pool down)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _init_worker(backend_json: str) -> None:
    global _BACKEND
    _ignore_interrupts()
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one core per worker; the pool is the parallelism
    from tokenizers import Tokenizer

    _BACKEND = Tokenizer.from_str(backend_json)


def _encode(texts: list[str]) -> tuple[list[np.ndarray], int]:
    docs = [np.asarray(e.ids, dtype=np.uint32) for e in _BACKEND.encode_batch(texts, add_special_tokens=False)]
    return docs, peak_rss_bytes()


def peak_rss_bytes() -> int:
    """This process's peak resident memory so far (Linux/macOS ``ru_maxrss``)."""
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def _tasks(texts: Iterable[str], chars: int = TASK_CHARS) -> Iterator[list[str]]:
    batch: list[str] = []
    size = 0
    for text in texts:
        batch.append(text)
        size += len(text)
        if size >= chars:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


class ParallelTokenizer:
    """Token ids (uint32 arrays) of documents, in corpus order, encoded by ``workers`` processes."""

    def __init__(self, backend_json: str, workers: int):
        self.backend_json, self.workers = backend_json, max(1, workers)
        self.worker_peak_rss = 0

    def documents(self, texts: Iterable[str], max_tokens: int | None = None) -> Iterator[np.ndarray]:
        """Stops once ``max_tokens`` ids have been yielded; the last document is cut to fit."""
        pool = ProcessPoolExecutor(self.workers, mp_context=_context(), initializer=_init_worker,
                                   initargs=(self.backend_json,))
        pending: deque = deque()
        total = 0
        try:
            tasks = _tasks(texts)
            while True:
                while len(pending) < self.workers * PENDING_PER_WORKER:
                    batch = next(tasks, None)
                    if batch is None:
                        break
                    pending.append(pool.submit(_encode, batch))
                if not pending:
                    return
                docs, peak = pending.popleft().result()
                self.worker_peak_rss = max(self.worker_peak_rss, peak)
                for ids in docs:
                    if max_tokens is not None and total + ids.size >= max_tokens:
                        if max_tokens - total > 0:
                            yield ids[: max_tokens - total]
                        return
                    total += ids.size
                    if ids.size:
                        yield ids
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def peak_rss_bytes(self) -> int:
        """Memory of the worker processes together (each reports its own peak)."""
        return self.worker_peak_rss * self.workers
