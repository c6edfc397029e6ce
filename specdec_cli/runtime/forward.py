"""The shared decoding engine: one target forward pass over a chain or a token tree, and KV-cache rollback.

Conventions (gpt-fast style, explicit positions):

* ``tokens`` is the whole sequence so far; the KV cache of a model holds ``tokens[:-1]``. The last token is
  the *root*: it is fed again together with the draft, so one forward pass returns ``p_target`` for the root
  and for every draft node.
* A draft is a tree given by ``parents`` (``-1`` = the root, otherwise the index of an earlier node). A chain is
  the tree ``parents = [-1, 0, 1, ...]``.
* The cache runs the forward (:class:`specdec_cli.runtime.cache.KVCache`): the growing cache sends chains
  through the model's own causal (and sliding-window) masks and trees with a 4-D attention mask (a dict per layer
  type for models that mix full and sliding-window layers) and explicit position ids; the static cache pads the
  query to a bucket and builds the masks inside its (compiled) forward. No model code is forked.
* Rollback: :func:`keep` drops rejected entries from the cache (a length change for chains; for a tree path, the
  accepted rows move down -- see :mod:`specdec_cli.runtime.kvcache`).
* Logits only where they are read: a prefill asks for none (``keep=0``), a draft model for its last row.
* Which cache a generation uses is its :class:`~specdec_cli.runtime.cache_mode.CacheMode`, given to
  :func:`new_cache`; everything after that asks the cache, never its class.
"""

from __future__ import annotations

import time

import torch

from . import kvcache
from . import static_cache
from .cache_mode import CacheMode
from .cache import KVCache


def new_cache(model=None, capacity: int = kvcache.MIN_CAPACITY, cache_mode: CacheMode = CacheMode.EAGER,
              slot: str = "target", greedy: bool = False) -> KVCache:
    """The KV cache for one generation: a growing one (:attr:`CacheMode.EAGER`), or the model's static cache with
    bucketed forwards, eager (``STATIC``) or compiled (``COMPILED``) -- :mod:`specdec_cli.runtime.static_cache`.
    ``greedy``: only its forwards' argmaxes are read (the lean forward may then screen the head,
    :mod:`specdec_cli.runtime.head_screen`)."""
    if not cache_mode.static or model is None:
        cache = kvcache.new_cache(model, capacity)
    else:
        cache = static_cache.cache_for(model, capacity, cache_mode, slot=slot)
    cache.greedy = greedy
    return cache


def cache_len(cache: KVCache) -> int:
    return cache.length


def input_device(model) -> torch.device:
    return model.get_input_embeddings().weight.device


def wall_clock(model):
    """``time.perf_counter`` once ``model``'s device has run what was queued: a CUDA forward returns before it ran,
    and a forward time read at its return would price every draft token as free."""
    device = input_device(model)
    if device.type != "cuda":
        return time.perf_counter

    def after_sync() -> float:
        torch.cuda.synchronize(device)
        return time.perf_counter()
    return after_sync


def forward_chain(model, cache: KVCache, tokens: list[int], keep: int | None = None) -> torch.Tensor:
    """Feed ``tokens`` after the cached prefix; returns float32 logits of the last ``keep`` rows (None: all rows,
    0: none -- a prefill whose logits nobody reads; the LM head is then skipped entirely)."""
    return cache.forward(model, tokens, keep=keep)


def forward_tree(model, cache: KVCache, root: int, draft_tokens: list[int], parents: list[int]) -> torch.Tensor:
    """Feed the root token and a draft tree in one pass; returns logits ``[1 + n, V]`` (row 0 = root)."""
    return cache.forward(model, [root, *draft_tokens], parents)


def crop(cache: KVCache, length: int) -> None:
    """Roll the cache back to its first ``length`` entries."""
    cache.crop_to(length)


def keep(cache: KVCache, prefix_len: int, rows: list[int]) -> None:
    """Keep ``cache[:prefix_len]`` plus the entries at ``prefix_len + r`` for each ``r`` in ``rows`` (ascending)."""
    cache.keep_tree_rows(prefix_len, rows)
