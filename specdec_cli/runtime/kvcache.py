"""A KV cache that never re-copies its past: pre-allocated buffers, views, and O(accepted) rollback.

transformers' ``DynamicLayer`` grows by ``torch.cat`` -- every decoding step copies the whole cache of every layer
into freshly allocated memory (13% of a Gemma-3-270M CPU step at a 600-token context, mostly page faults; see
docs/profiling.md). :class:`GrowingLayer` keeps one buffer per layer with spare capacity (doubling when full) and
hands the model views of it, so a step writes only its new rows.

It is a ``DynamicLayer`` subclass plugged into transformers' own ``Cache`` container, so no model code changes:

* ``update`` writes the new keys/values at the end and returns a view of what attention needs -- all of it for a
  full-attention layer, the last ``window - 1`` past entries plus the new ones for a sliding-window layer (what
  ``get_mask_sizes`` advertises to the model's mask builder, as transformers' ``DynamicSlidingWindowLayer`` does);
* ``crop`` only moves the length back (the buffer keeps its rows; later writes overwrite them);
* ``keep_rows`` moves an accepted tree path's rows down to the end of the prefix: it copies ``len(rows)`` entries,
  not the whole cache.

Sliding-window layers keep every entry too (only the *view* is windowed), so any rollback is exact.

The engine's cache interface is :class:`specdec_cli.runtime.cache.KVCache`. Its one-sequence implementations are
:class:`GrowingCache` here (eager) and :class:`specdec_cli.runtime.static_cache.StaticCache` (bucketed, optionally
compiled); :class:`specdec_cli.runtime.batch_cache.BatchCache` holds many rows. The one-sequence layers share row moves
and copies through :class:`RowsLayer`; both build tree masks with :func:`specdec_cli.runtime.masks.tree_mask`.
"""

from __future__ import annotations

import inspect
from functools import lru_cache

import torch
from transformers.cache_utils import DynamicLayer

from . import decoder, kernels
from .cache import MIN_CAPACITY, KVCache
from .cache_mode import CacheMode
from .masks import layer_masks, layer_windows, masks_to, tree_mask
from .positions import ancestor_matrix, depths, is_chain

NO_ROWS = torch.empty(0, dtype=torch.long)


class RowsLayer:
    """What both cache layers share: moving a tree path's rows down and copying rows from another layer. A layer
    gives its whole buffers (:meth:`buffers`), sets its length (:meth:`set_length`) and makes room for rows."""

    grows = False  # True: the buffers grow on demand (no row limit)

    def buffers(self) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def set_length(self, length: int) -> None:
        self.length = length

    def make_room(self, start: int, end: int, keys: torch.Tensor, values: torch.Tensor, dtype) -> None:
        """Before rows ``[start, end)`` are written from ``keys``/``values``."""

    def can_take(self, keys: torch.Tensor, end: int) -> bool:
        """Whether rows ``[:end]`` shaped like ``keys`` fit this layer."""
        if not self.is_initialized:
            return True
        buf = self.buffers()[0]
        if buf.shape[:-2] != keys.shape[:-2] or buf.shape[-1] != keys.shape[-1]:
            return False
        return self.grows or end <= buf.shape[-2]

    @torch.inference_mode()
    def copy_from(self, other, start: int, end: int, dtype: torch.dtype | None = None) -> None:
        """Make entries ``[start, end)`` those of ``other`` (cast to this layer's dtype, or ``dtype`` for a layer
        not yet written); the length becomes ``end``."""
        keys, values = other.keys[..., start:end, :], other.values[..., start:end, :]
        self.make_room(start, end, keys, values, dtype)
        k, v = self.buffers()
        k[..., start:end, :] = keys
        v[..., start:end, :] = values
        self.set_length(end)

    @torch.inference_mode()
    def keep_rows(self, prefix_len: int, rows: list[int]) -> None:
        """Keep entries ``[:prefix_len]`` plus ``prefix_len + r`` for ``r`` in ``rows`` (ascending), in that order:
        only the rows that move are copied."""
        if not self.is_initialized:
            return
        moved = [(prefix_len + i, prefix_len + r) for i, r in enumerate(rows) if r != i]
        if moved:
            k, v = self.buffers()
            dst = torch.tensor([d for d, _ in moved], device=k.device)
            src = torch.tensor([s for _, s in moved], device=k.device)
            for buf in (k, v):
                buf.index_copy_(-2, dst, buf.index_select(-2, src))
        self.set_length(prefix_len + len(rows))


class GrowingLayer(RowsLayer, DynamicLayer):
    grows = True

    def __init__(self, capacity: int = MIN_CAPACITY, window: int | None = None):
        super().__init__()
        self.capacity = max(int(capacity), 1)
        self.window = window
        self.is_sliding = window is not None
        self.length = 0
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        shape = key_states.shape[:-2]
        self._k = torch.empty((*shape, self.capacity, key_states.shape[-1]), dtype=self.dtype, device=self.device)
        self._v = torch.empty((*shape, self.capacity, value_states.shape[-1]), dtype=self.dtype, device=self.device)
        self.is_initialized = True
        self._set_views()

    def buffers(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self._k, self._v

    def set_length(self, length: int) -> None:
        self.length = length
        self._set_views()

    def make_room(self, start: int, end: int, keys: torch.Tensor, values: torch.Tensor, dtype) -> None:
        if not self.is_initialized:
            self.lazy_initialization(keys.to(dtype or keys.dtype), values.to(dtype or values.dtype))
        self.length = min(self.length, start)
        self._reserve(end)

    def _set_views(self) -> None:
        self.keys = self._k[..., : self.length, :]
        self.values = self._v[..., : self.length, :]

    def _reserve(self, needed: int) -> None:
        if needed <= self._k.shape[-2]:
            return
        size = max(needed, 2 * self._k.shape[-2])
        for name in ("_k", "_v"):
            old = getattr(self, name)
            new = old.new_empty((*old.shape[:-2], size, old.shape[-1]))
            new[..., : self.length, :] = old[..., : self.length, :]
            setattr(self, name, new)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        past, n = self.length, key_states.shape[-2]
        self._reserve(past + n)
        self._k[..., past: past + n, :] = key_states
        self._v[..., past: past + n, :] = value_states
        self.length = past + n
        self._set_views()
        start = self.visible_start(past)
        return self._k[..., start: self.length, :], self._v[..., start: self.length, :]

    def visible_start(self, past: int) -> int:
        """First cached position attention sees when ``past`` entries precede the new ones."""
        return 0 if self.window is None else max(past - self.window + 1, 0)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        offset = self.visible_start(self.length)
        return self.length - offset + query_length, offset

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self.length = 0
        if self.is_initialized:
            self._set_views()

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("GrowingLayer.crop takes a negative count of tokens to remove")
        if self.is_initialized and tokens_to_remove:
            self.length = max(self.length + tokens_to_remove, 0)
            self._set_views()


@lru_cache(maxsize=None)
def _takes_logits_to_keep(forward_type) -> bool:
    return "logits_to_keep" in inspect.signature(forward_type.forward).parameters


def _rows_arg(model, keep: int | None) -> dict:
    """``logits_to_keep`` for the last ``keep`` rows (None: all; 0: none -- an empty index list)."""
    if keep is None or not _takes_logits_to_keep(type(model)):
        return {}
    return {"logits_to_keep": NO_ROWS if keep == 0 else keep}


class GrowingCache(KVCache):
    """The eager cache: :class:`GrowingLayer` (or, built with ``layer_class_to_replicate``, any transformers layer
    for chain forwards and crops). Chains go through the model's own causal (and sliding-window) masks; trees pass a
    4-D additive mask (a dict per layer type where full and sliding-window layers mix) and explicit positions."""

    mode = CacheMode.EAGER

    def companion_capacity(self) -> int:
        return MIN_CAPACITY

    @torch.inference_mode()
    def forward(self, model, tokens: list[int], parents: list[int] | None = None,
                keep: int | None = None) -> torch.Tensor:
        if len(tokens) <= decoder.MAX_ROWS or decoder.takes_every_forward(model):
            out = decoder.run(self, model, tokens, parents, keep)
            if out is not None:
                return out
        dev = model.get_input_embeddings().weight.device
        ids = torch.tensor([tokens], dtype=torch.long, device=dev)
        if parents is None or is_chain(parents):
            start = self.length
            extra = {"position_ids": torch.arange(start, start + len(tokens), device=dev).unsqueeze(0),
                     **_rows_arg(model, keep)}
        else:
            mask, pos = self.tree_inputs(model, parents)
            extra = {"position_ids": pos.to(dev), "attention_mask": masks_to(mask, dev)}
        with kernels.active():
            out = model(input_ids=ids, past_key_values=self, use_cache=True, **extra)
        return out.logits[0].float()

    def tree_inputs(self, model, parents: list[int]) -> tuple[object, torch.Tensor]:
        """The 4-D additive mask(s) and position ids ``[1, n]`` for ``root + tree`` after the cached prefix. A
        sliding-window mask covers the entries its layers show (only the last ``window - 1`` past ones when the
        layers are windowed) and masks, row by row, whatever lies beyond that row's own window."""
        prefix, anc = self.length, ancestor_matrix(parents)
        q_pos = prefix + torch.tensor([0] + depths(parents))
        cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        layer_types, window = getattr(cfg, "layer_types", None), getattr(cfg, "sliding_window", None)
        if not (layer_types and window and "sliding_attention" in layer_types):
            layer_types, window = ["full_attention"], None
        windowed = any(getattr(layer, "window", None) for layer in self.layers)

        def mask_for(win: int | None) -> torch.Tensor:
            start = max(prefix - win + 1, 0) if win and windowed else 0
            columns = torch.arange(start, prefix + anc.shape[0])
            return tree_mask(columns, prefix, anc, q_pos, win, model.dtype)

        return layer_masks(layer_types, window, mask_for), q_pos.unsqueeze(0)


def new_cache(model=None, capacity: int = MIN_CAPACITY) -> GrowingCache:
    """A cache of :class:`GrowingLayer` for ``model`` (sliding-window layers windowed as its config says)."""
    capacity = max(int(capacity), 1)
    windows = layer_windows(model.config) if model is not None else []
    if windows:
        return GrowingCache(layers=[GrowingLayer(capacity, w) for w in windows])
    return GrowingCache(layer_class_to_replicate=lambda: GrowingLayer(capacity))
