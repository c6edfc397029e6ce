"""Static KV cache and bucketed, optionally compiled forwards: the GPU fast path (gpt-fast style).

On a GPU a small model's step is launch- and Python-bound: eager PyTorch spends more time issuing kernels than
running them. The cure (gpt-fast) is to make every step's shapes static and replay it as a CUDA graph:

* :class:`StaticLayer` -- one pre-allocated ``[1, heads, capacity, dim]`` buffer per layer. A forward writes its
  new rows at the positions in ``write_at`` (a tensor, so the positions are data, not part of the graph) and
  attends over the *whole* buffer; what a row may see is said by the attention mask alone. Rollback is a length
  change (``crop``) or moving an accepted tree path's rows down (``keep_rows``) -- rows past the length are
  simply never visible again. Sliding-window layers (Gemma-3) keep every row too: the window is in the mask.
* :class:`StaticCache` -- the layers plus the forward: a step's query (the root and its draft nodes) is padded to
  the next bucket size (1, 2, 4, ... 128); the padded rows see only the prefix and themselves and their logits
  are dropped. Ids, positions, the ancestor matrix and the prefix length reach the device in one copy of one
  per-bucket buffer and the masks are built inside the forward, so a compiled step is that copy, one add and the
  replay of the bucket's CUDA graph (``mode="reduce-overhead"``). The prefill runs eager, in chunks.

It implements the engine's one-sequence cache interface (:class:`specdec_cli.runtime.cache.KVCache`) beside the
growing cache, sharing its row moves (``kvcache.RowsLayer``) and mask (:func:`specdec_cli.runtime.masks.tree_mask`):
:mod:`specdec_cli.runtime.forward` calls both alike, so every method runs on it and stays lossless.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from transformers.cache_utils import CacheLayerMixin

from .cache_mode import CacheMode
from .cache import KVCache
from .kvcache import RowsLayer
from .masks import layer_masks, layer_windows, tree_mask
from .positions import ancestor_matrix, depths

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
PREFILL_CHUNK = 512
HEADROOM = max(BUCKETS[-1], PREFILL_CHUNK)  # rows past the sequence that a padded step may write
WARM_CALLS = 3  # calls per bucket before timing on a compiled path: compile, CUDA-graph warm-up, recording
MIN_CAPACITY = 2048  # buffers grow by doubling from here: one set of compiled graphs serves many prompt lengths


def bucket(n: int) -> int:
    for size in BUCKETS:
        if n <= size:
            return size
    raise ValueError(f"a step of {n} query tokens exceeds the largest bucket ({BUCKETS[-1]})")


class StaticLayer(RowsLayer, CacheLayerMixin):
    is_compileable = True
    is_sliding = False

    def __init__(self, capacity: int, window: int | None = None):
        super().__init__()
        self.capacity, self.window = capacity, window
        self.length = 0  # rows that are part of the sequence (host-side bookkeeping: no device sync)
        self.write_at: torch.Tensor | None = None  # where the next update writes (set by StaticCache)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        b, h = key_states.shape[:2]
        self.keys = torch.zeros((b, h, self.capacity, key_states.shape[-1]), dtype=self.dtype, device=self.device)
        self.values = torch.zeros((b, h, self.capacity, value_states.shape[-1]), dtype=self.dtype, device=self.device)
        if self.device.type == "cuda":  # fixed addresses: in-place updates do not break CUDA graphs
            torch._dynamo.mark_static_address(self.keys)
            torch._dynamo.mark_static_address(self.values)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.keys.index_copy_(2, self.write_at, key_states)
        self.values.index_copy_(2, self.write_at, value_states)
        return self.keys, self.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.capacity, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return self.capacity

    def reset(self) -> None:
        self.length = 0

    def crop(self, tokens_to_remove: int) -> None:
        self.length = max(self.length + min(tokens_to_remove, 0), 0)

    def buffers(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.keys, self.values


class StaticCache(KVCache):
    """A static cache bound to one model, with its bucketed forwards (compiled or eager, as ``mode`` says)."""

    max_draft_nodes = BUCKETS[-1] - 1  # the root and the draft fill one bucket

    def __init__(self, model, capacity: int, mode: CacheMode = CacheMode.STATIC):
        windows = layer_windows(model.config)
        super().__init__(layers=[StaticLayer(capacity, w) for w in windows])
        self.model, self.capacity, self.mode = model, capacity, mode
        cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.window = getattr(cfg, "sliding_window", None) if any(w for w in windows) else None
        self.layer_types = sorted({"sliding_attention" if w else "full_attention" for w in windows})
        self.device = model.get_input_embeddings().weight.device
        self.mask_dtype = model.dtype
        self.columns = torch.arange(capacity, device=self.device)
        self.buffers: dict[int, dict] = {}
        self.size_of: dict[int, int] = {}  # packed length -> bucket size
        kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        empty = torch.empty((1, kv_heads, 0, head_dim), dtype=model.dtype, device=self.device)
        for layer in self.layers:  # allocated now: a compiled graph never sees an uninitialized layer
            layer.lazy_initialization(empty, empty)
        self.run = _compile(self._forward) if mode.compiled else self._forward
        self.warmed = False  # every bucket compiled ahead of the first timed step (:func:`warm`)

    @property
    def length(self) -> int:
        return self.layers[0].length

    def companion_capacity(self) -> int:
        return self.capacity - HEADROOM

    def forward(self, model, tokens: list[int], parents: list[int] | None = None,
                keep: int | None = None) -> torch.Tensor:
        """The bound model's forward (``model`` is it): a chain (:meth:`forward_chain`) or a tree."""
        if parents is None:
            return self.forward_chain(tokens, keep)
        return self.forward_tree(tokens[0], tokens[1:], parents)

    def reset(self) -> None:
        """Emptied for the next generation: no entries, its one row back (a batch of one dropped it)."""
        self.rows = 1
        for layer in self.layers:
            layer.reset()

    def _forward(self, packed: torch.Tensor) -> torch.Tensor:
        """One bucketed forward from one small tensor: ids, positions, the ancestor matrix and the prefix length
        (:meth:`_step`). The masks are built here, inside the compiled region."""
        size = self.size_of[packed.shape[0]]
        ids, pos = packed[:size].unsqueeze(0), packed[size: 2 * size]
        anc = packed[2 * size: 2 * size + size * size].view(size, size) != 0
        mask = self._masks(packed[-1], anc, pos)
        out = self.model(input_ids=ids, position_ids=pos.unsqueeze(0), attention_mask=mask, past_key_values=self,
                         use_cache=True)
        return out.logits

    def _masks(self, prefix: torch.Tensor, anc: torch.Tensor, pos: torch.Tensor):
        """Additive masks [1, 1, rows, capacity] over the whole buffer (:func:`~specdec_cli.runtime.masks.tree_mask`):
        the rows past the length are masked like every column that is neither prefix nor an ancestor."""
        return layer_masks(self.layer_types, self.window,
                           lambda window: tree_mask(self.columns, prefix, anc, pos, window, self.mask_dtype))

    def _buffers(self, size: int) -> dict:
        """Per bucket: a host staging tensor and its device twin (ids, positions, ancestors, prefix length:
        ``2 size + size^2 + 1`` int64), the write positions, and ``arange(size)``."""
        if size not in self.buffers:
            length = 2 * size + size * size + 1
            cuda = self.device.type == "cuda"
            buf = {"staging": torch.zeros(length, dtype=torch.long, pin_memory=cuda),
                   "packed": torch.zeros(length, dtype=torch.long, device=self.device),
                   "write_at": torch.zeros(size, dtype=torch.long, device=self.device),
                   "offsets": torch.arange(size, device=self.device)}
            if cuda:
                for name in ("packed", "write_at"):
                    torch._dynamo.mark_static_address(buf[name])
            self.buffers[size], self.size_of[length] = buf, size
        return self.buffers[size]

    def _step(self, tokens: list[int], anc: torch.Tensor, q_pos: list[int], size: int, run) -> torch.Tensor:
        n, prefix_len = len(tokens), self.length
        if prefix_len + size > self.capacity:
            raise ValueError(f"static cache of {self.capacity} rows is full")
        buf = self._buffers(size)
        stage = buf["staging"].numpy()
        stage[:n], stage[n:size] = tokens, 0
        stage[size: size + n], stage[size + n: 2 * size] = q_pos, prefix_len
        square = np.eye(size, dtype=np.int64)  # padding rows see themselves (and the prefix) only
        square[:n, :n] = anc.numpy()
        stage[2 * size: 2 * size + size * size] = square.reshape(-1)
        stage[-1] = prefix_len
        buf["packed"].copy_(buf["staging"], non_blocking=True)
        torch.add(buf["offsets"], buf["packed"][-1], out=buf["write_at"])
        for layer in self.layers:
            layer.write_at = buf["write_at"]
        logits = run(buf["packed"])
        for layer in self.layers:
            layer.length = prefix_len + n
        return logits[0, :n]

    @torch.inference_mode()
    def forward_chain(self, tokens: list[int], keep: int | None = None) -> torch.Tensor:
        """Like :func:`specdec_cli.runtime.forward.forward_chain`. Prefills (``keep=0``, or longer than a bucket) run eager,
        in chunks of ``PREFILL_CHUNK`` rows (the last one padded), so their buffers have a few fixed sizes too;
        a draft model's short chains that return logits go through the bucket's (compiled) forward."""
        if len(tokens) <= BUCKETS[-1]:
            anc = torch.ones((len(tokens), len(tokens)), dtype=torch.bool).tril()
            q_pos = list(range(self.length, self.length + len(tokens)))
            run = self._forward if keep == 0 else self.run  # a draft model's steps replay graphs; prefills do not
            logits = self._step(tokens, anc, q_pos, bucket(len(tokens)), run).float()
        else:
            parts = []
            for start in range(0, len(tokens), PREFILL_CHUNK):
                part = tokens[start: start + PREFILL_CHUNK]
                anc = torch.ones((len(part), len(part)), dtype=torch.bool).tril()
                size = bucket(len(part)) if len(part) <= BUCKETS[-1] else PREFILL_CHUNK
                rows = self._step(part, anc, list(range(self.length, self.length + len(part))), size, self._forward)
                parts.append(rows if keep is None else rows[-keep:] if keep else rows[:0])
            logits = torch.cat(parts).float()
        if keep is None:
            return logits
        return logits[logits.shape[0] - keep:]

    @torch.inference_mode()
    def forward_tree(self, root: int, draft_tokens: list[int], parents: list[int]) -> torch.Tensor:
        n = 1 + len(draft_tokens)
        anc = ancestor_matrix(parents)
        q_pos = [self.length + d for d in [0] + depths(parents)]
        return self._step([root, *draft_tokens], anc, q_pos, bucket(n), self.run).float()


# Dynamo keeps at most ``recompile_limit`` graphs per code object (8 by default), then runs the function eager.
# Every StaticCache compiles the same ``_forward``: 8 buckets for each (model, dtype, capacity) -- a target and a
# draft copy, or a prompt past 2,048 rows, already make 16. Room for 8 such variants.
RECOMPILE_LIMIT = len(BUCKETS) * 8


def _compile(fn):
    """CUDA graphs through ``torch.compile(mode="reduce-overhead")`` on CUDA; inductor's default elsewhere.
    One graph per bucket (``dynamic=False``: every input shape of a bucket is fixed)."""
    cuda = torch.cuda.is_available()
    config = torch._dynamo.config
    limit = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"  # its name before 2.7
    setattr(config, limit, max(getattr(config, limit), RECOMPILE_LIMIT))
    return torch.compile(fn, mode="reduce-overhead" if cuda else "default", dynamic=False, fullgraph=False)


_POOL: dict[tuple[int, str], StaticCache] = {}


def capacity_for(needed: int) -> int:
    capacity = MIN_CAPACITY
    while capacity < needed + HEADROOM:
        capacity *= 2
    return capacity


def cache_for(model, needed: int, mode: CacheMode = CacheMode.STATIC, slot: str = "target") -> StaticCache:
    """The model's static cache, emptied, with room for ``needed`` rows plus the largest bucket. One cache per
    model and ``slot`` (the target's, a draft's) is kept with its compiled graphs and reused while it is large
    enough and of the same mode."""
    capacity = capacity_for(needed)
    cache = _POOL.get((id(model), slot))
    if cache is None or cache.model is not model or cache.capacity < capacity or cache.mode is not mode:
        cache = StaticCache(model, capacity, mode)
        _POOL[(id(model), slot)] = cache
    cache.reset()
    return cache


@torch.inference_mode()
def warm(model, mode: CacheMode, needed: int = 0, *, slot: str = "target", keep: bool = True,
         calls: int = WARM_CALLS, sizes: tuple[int, ...] = BUCKETS) -> float:
    """Compile (and under CUDA graphs warm up and record) every bucket of the pooled cache that a generation of
    ``needed`` rows gets (:func:`cache_for`), before anything is timed: otherwise a bucket compiles the first time a
    draft needs it, inside a timed generation (on an H200 the first HumanEval prompt of compiled ``auto`` took 13.5 s
    against 0.3-0.4 s for the next ones). ``calls`` per bucket: the first compiles, under reduce-overhead the second
    warms up and the third records. Once per cache (another capacity has other shapes); graphs are shared by every
    cache of the same shapes, so ``keep=False`` warms a temporary cache and drops it (a draft model's own cache then
    records them: :func:`warm_compiled`). Returns the seconds spent."""
    if not mode.compiled:
        return 0.0
    cache = cache_for(model, needed, mode, slot)
    if cache.warmed:
        return 0.0
    t0 = time.perf_counter()
    vocab = model.get_input_embeddings().weight.shape[0]
    for size in sizes:
        tokens = [i % vocab for i in range(size)]
        for _ in range(calls):
            cache.forward_tree(tokens[0], tokens[1:], list(range(-1, size - 2)))  # a chain of ``size`` rows
            cache.crop_to(0)
    cache.reset()
    cache.warmed = True
    compiled = model.__dict__.setdefault("_specdec_compiled", {})  # kept on the model: an id could be reused
    compiled.setdefault(cache.capacity, set()).update(sizes)
    if not keep:
        _POOL.pop((id(model), slot), None)
    return time.perf_counter() - t0


def warm_compiled(model, mode: CacheMode, needed: int, slot: str) -> float:
    """Warm ``slot``'s cache in the buckets :func:`warm` compiled for this model and capacity in another cache
    (bench's warm-up); none (``specdec generate``): nothing, they compile on first use."""
    sizes = model.__dict__.get("_specdec_compiled", {}).get(capacity_for(needed))
    return warm(model, mode, needed, slot=slot, sizes=tuple(sorted(sizes))) if sizes else 0.0
