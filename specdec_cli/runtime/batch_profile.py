"""What a batched forward costs on this machine: ``T(rows, width)``, one forward over ``rows`` sequences with
``width`` query positions each (:class:`~specdec_cli.runtime.batch_cache.BatchCache`).

A one-sequence profile ``t(n)`` (:mod:`specdec_cli.runtime.profile`) does not price a batch: measured on
SmolLM2-135M (2 threads), 16 rows x 2 positions cost 1.84x 16 rows x 1 position, while ``t(32) / t(16)`` is
1.35x -- with many rows the forward is compute-bound and a draft token costs nearly what a whole row does. So the
batched budget is priced with forwards timed as they run: for ``rows`` in powers of two up to the batch size and
``width`` in :data:`WIDTHS`, after ``CONTEXT`` cached tokens per row; between measured row counts the time is
interpolated linearly; wider forwards are priced in proportion to their tokens (compute-bound). Cached like the
one-sequence profile (per machine, torch version, threads, weights and kernels), measured once: a few seconds per
row count.
"""

from __future__ import annotations

import json

import numpy as np
import torch

from . import forward
from .batch_cache import BatchCache
from .cache import CACHE_SLACK
from .profile import CONTEXT, _path, model_key
from ..io.atomic import write_cache
from ..io.jsonl import read_json

WIDTHS = (1, 2, 3, 4, 6, 8)
VERSION = 4  # 4: a greedy batch's head is screened (runtime/head_screen); 3: a greedy batch's rows attend their own
# columns (runtime/attend.batch_rows), a sampled one's SDPA: each is timed on its own path (tables of version 2
# timed SDPA, or batch_rows, under one key)


class BatchTimes:
    """``T(rows, width)`` in seconds from per-row-count tables (``tables[rows] = seconds per WIDTHS``)."""

    def __init__(self, tables: dict[int, list[float]]):
        self.rows = sorted(tables)
        self.tables = {r: np.asarray(tables[r], dtype=np.float64) for r in self.rows}
        self._memo: dict[tuple[int, int], float] = {}

    def _at(self, rows: int, width: int) -> float:
        y, x = self.tables[rows], np.asarray(WIDTHS, dtype=np.float64)
        if width <= x[-1]:
            return float(np.interp(width, x, y))
        return float(y[-1] * width / x[-1])  # wider than measured: compute-bound, proportional to the tokens

    def __call__(self, rows: int, width: int) -> float:
        hit = self._memo.get((rows, width))
        if hit is None:
            below = max([r for r in self.rows if r <= rows], default=self.rows[0])
            above = min([r for r in self.rows if r >= rows], default=self.rows[-1])
            lo, hi = self._at(below, width), self._at(above, width)
            if above == below:
                hit = lo * rows / below  # beyond the largest measured batch: linear in rows
            else:
                hit = lo + (hi - lo) * (rows - below) / (above - below)
            self._memo[(rows, width)] = hit
        return hit


@torch.inference_mode()
def measure_rows(model, rows: int, context: int = CONTEXT, exact: bool = False) -> list[float]:
    """Seconds of one batched forward per width of :data:`WIDTHS`, ``rows`` rows of ``context`` cached tokens;
    ``exact``: with SDPA's attention, the path a sampled batch takes (``BatchCache(own_columns=False)``)."""
    vocab = model.get_input_embeddings().weight.shape[0]
    gen = torch.Generator().manual_seed(0)
    ctx = torch.randint(0, vocab, (context + max(WIDTHS) + 1,), generator=gen).tolist()
    single = forward.new_cache(model, context + CACHE_SLACK)  # the context, prefilled once and copied into every row
    forward.forward_chain(model, single, ctx[:context], keep=0)
    cache = BatchCache(model, rows, context + max(WIDTHS) + CACHE_SLACK, own_columns=not exact,
                       greedy=not exact)  # the widest fits
    for row in range(rows):
        cache.load_row(row, single, context)

    clock = forward.wall_clock(model)

    def once(width: int) -> float:
        draft = (ctx[context: context + width], list(range(-1, width - 2)))
        t0 = clock()
        cache.forward_rows(model, [draft] * rows)
        spent = clock() - t0
        cache.keep_paths([[]] * rows)  # back to the context
        cache.lengths = [context] * rows
        return spent

    once(2)  # warm-up
    best = [min(once(w) for _ in range(3)) for w in WIDTHS]  # the best of three: a busy moment does not stick
    return list(np.maximum.accumulate(best))


def batch_times_for(model, max_rows: int, progress=None, exact: bool = False) -> BatchTimes:
    """The cached ``T(rows, width)`` for row counts 1, 2, 4, ... up to ``max_rows``, measured now where missing;
    ``exact``: of the forward a sampled batch runs (SDPA's attention, :func:`measure_rows`)."""
    counts = sorted({min(2 ** k, max_rows) for k in range(max(max_rows, 1).bit_length() + 1)})
    tables = {}
    for rows in counts:
        key = model_key(model, f"|batch={rows}|{'sdpa' if exact else 'rows'}|v{VERSION}")
        try:
            data = read_json(_path(key))
            if data.get("key") == key and len(data["seconds"]) == len(WIDTHS):
                tables[rows] = [float(s) for s in data["seconds"]]
                continue
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass
        if progress:
            progress(f"measuring batched forward times for {rows} rows (once per model and thread count)")
        tables[rows] = measure_rows(model, rows, exact=exact)
        write_cache(_path(key), json.dumps({"key": key, "rows": rows, "widths": WIDTHS, "seconds": tables[rows]}))
    return BatchTimes(tables)
