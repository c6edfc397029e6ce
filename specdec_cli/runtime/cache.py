"""The engine's KV-cache interface, one for a single sequence or for many rows (issue 34).

Every loop and every draft model asks a cache the same things, and never its class:

* a **step** over ``rows`` sequences: :meth:`KVCache.forward_rows` feeds each row its root and draft tree (positions
  and masks built by the cache) and returns each row's logits; :meth:`KVCache.keep_paths` then keeps, per row, the
  root and the accepted path. A one-sequence cache is the case ``rows == 1``.
* rows that **come and go**: :meth:`KVCache.prefill_row` writes a prompt into a row, :meth:`KVCache.drop_rows` drops
  finished rows.
* **reading** one row as a one-sequence cache (``length``, ``layers[i].keys``/``values``, ``mode``,
  ``companion_capacity``): :meth:`KVCache.row_view`, what a draft model that copies the target's states reads.
* the **one-sequence** operations underneath (``forward`` of a chain or a tree, ``crop_to``, ``keep_tree_rows``,
  ``copy_prefix``), which prefills and draft models use; a cache of many rows raises on them (its rows are read
  one at a time through ``row_view``).

Implementations: :class:`~specdec_cli.runtime.kvcache.GrowingCache` (eager) and
:class:`~specdec_cli.runtime.static_cache.StaticCache` (bucketed, optionally compiled) hold one sequence;
:class:`~specdec_cli.runtime.batch_cache.BatchCache` holds many at their own lengths.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache

from .cache_mode import CacheMode

MIN_CAPACITY = 256  # entries a one-sequence cache starts with (it doubles when full): a chat prompt and its answer
# cache rows beyond the prompt and the output: the last step's root and a few draft nodes past the end (a growing
# cache grows further when a tree needs it; a static cache caps drafts to its bucket instead: max_draft_nodes)
CACHE_SLACK = 8


class KVCache(Cache):
    """The engine's KV cache: a transformers ``Cache`` that also knows how to run a forward over it and roll back.

    ``tokens`` fed to :meth:`forward` follow the cached prefix; ``parents`` (None: a chain) makes them a draft tree
    whose node ``i`` sees the prefix and its ancestors. Rollback keeps the first ``length`` entries
    (:meth:`crop_to`) or a tree path's rows (:meth:`keep_tree_rows`). The row-shaped methods (module doc) serve a
    one-sequence cache as one row."""

    mode: CacheMode
    max_draft_nodes: int | None = None  # the most draft nodes one forward takes (None: no limit)
    rows: int = 1  # sequences held (0 once the only one is dropped)
    greedy: bool = False  # only the argmaxes of its forwards' logits are read (runtime/head_screen may give those)
    pending: list[int] | None = None  # each row's length before the last forward_rows (keep_paths cuts back to it)

    @property
    def length(self) -> int:
        return self.get_seq_length()

    # -- one sequence -------------------------------------------------------------------------------------------

    def forward(self, model, tokens: list[int], parents: list[int] | None = None,
                keep: int | None = None) -> torch.Tensor:
        """Feed ``tokens``; float32 logits of the last ``keep`` rows (None: all, 0: none; a tree returns all)."""
        raise NotImplementedError

    def companion_capacity(self) -> int:
        """The capacity to ask for a cache of another model on the same path (a draft model's)."""
        raise NotImplementedError

    def keep_module_bits(self) -> None:
        """A draft model that copies this cache's keys and values (a copy of the target) reads them from here:
        every forward from now on writes them as the module code does (a batch's rows stop attending their own
        columns, runtime/attend.batch_rows), so the draft's logits -- and the drafts an entropy window or a
        threshold cuts from them -- follow the module code's whatever the batch size. One sequence's cache
        always does."""

    def crop_to(self, length: int) -> None:
        """Roll back to the first ``length`` entries (transformers v5: ``crop(-n)`` removes ``n``)."""
        excess = self.length - length
        if excess > 0:
            self.crop(-excess)

    def keep_tree_rows(self, prefix_len: int, rows: list[int]) -> None:
        """Keep entries ``[:prefix_len]`` plus ``prefix_len + r`` for each ``r`` in ``rows`` (ascending)."""
        if rows == list(range(len(rows))):
            self.crop_to(prefix_len + len(rows))
            return
        for layer in self.layers:
            layer.keep_rows(prefix_len, rows)

    def copy_prefix(self, src: Cache, start: int, end: int, dtype: torch.dtype | None = None) -> bool:
        """Copy entries ``[start, end)`` of every layer of ``src`` (a cache of a model with the same layers, e.g. a
        quantized copy) into this cache; returns False, copying nothing, when the layers do not match."""
        if len(src.layers) != len(self.layers) or not all(hasattr(d, "copy_from") for d in self.layers):
            return False
        for d, s in zip(self.layers, src.layers):
            if s.keys is None or s.keys.shape[-2] < end or not d.can_take(s.keys, end):
                return False
        for d, s in zip(self.layers, src.layers):
            d.copy_from(s, start, end, dtype)
        return True

    # -- rows ---------------------------------------------------------------------------------------------------

    def forward_rows(self, model, drafts: list[tuple[list[int], list[int]]]) -> list:
        """One forward over every row: ``drafts[b] = (tokens, parents)`` -- row ``b``'s root followed by its draft
        tree (``parents``: the draft nodes'). Returns float32 logits ``[len(tokens), V]`` per row (a greedy
        ``BatchCache``: their argmaxes, :class:`~specdec_cli.runtime.head_screen.GreedyRows`, where proven)."""
        if len(drafts) != self.rows:
            raise ValueError(f"a forward takes one draft per row: {len(drafts)} for {self.rows} rows")
        (tokens, parents), = drafts
        self.pending = [self.length]
        return [self.forward(model, tokens, parents)]

    def keep_paths(self, paths: list[list[int]]) -> None:
        """After :meth:`forward_rows`: row ``b`` keeps its prefix plus its query rows ``paths[b]`` (ascending; 0
        is the root), moved down to follow the prefix."""
        if self.pending is None:
            raise ValueError("keep_paths without a forward_rows before it")
        (rows,), (prefix_len,) = paths, self.pending
        self.pending = None
        self.keep_tree_rows(prefix_len, rows)

    def prefill_row(self, model, row: int, tokens: list[int]) -> None:
        """Row ``row`` becomes the cache of ``tokens`` (a prompt without its last token, the first step's root)."""
        if row != 0:
            raise ValueError(f"row {row} of a one-sequence cache")
        self.rows = 1  # its one row, live again (after drop_rows)
        self.crop_to(0)
        if tokens:
            self.forward(model, list(tokens), keep=0)

    def drop_rows(self, free: list[int]) -> list[int]:
        """Rows ``free`` leave; returns, for each row left, the old row it holds (module doc)."""
        self.rows = 0 if 0 in free else self.rows
        return list(range(self.rows))

    def row_view(self, row: int):
        """Row ``row`` as a one-sequence cache (what a draft model reads): the cache itself when it holds one."""
        if row != 0:
            raise ValueError(f"row {row} of a one-sequence cache")
        return self


class RowView:
    """Row ``row`` of a many-row cache (``lengths``, ``rows``, and layers with ``row(b, length)``: a
    :class:`~specdec_cli.runtime.batch_cache.BatchCache`) as a one-sequence cache (``length``,
    ``layers[i].keys``/``values``, ``mode``, ``companion_capacity``): what a draft model that copies the target's
    states reads. The loop moves ``row`` when rows are dropped."""

    mode = CacheMode.EAGER

    def __init__(self, cache: KVCache, row: int):
        self.cache, self.row = cache, row
        self.layers = [_RowLayer(self, layer) for layer in cache.layers]

    @property
    def length(self) -> int:
        return self.cache.lengths[self.row] if self.row < self.cache.rows else 0

    def companion_capacity(self) -> int:
        return MIN_CAPACITY

    def keep_module_bits(self) -> None:
        self.cache.keep_module_bits()


class _RowLayer:
    def __init__(self, view: RowView, layer):
        self.view, self.layer = view, layer

    @property
    def keys(self):
        return self.layer.row(self.view.row, self.view.length)[0]

    @property
    def values(self):
        return self.layer.row(self.view.row, self.view.length)[1]
