"""The shared decoding engine: one target forward pass over a chain or a token tree, and KV-cache rollback.

Conventions (gpt-fast style, explicit positions):

* ``tokens`` is the whole sequence so far; the KV cache of a model holds ``tokens[:-1]``. The last token is
  the *root*: it is fed again together with the draft, so one forward pass returns ``p_target`` for the root
  and for every draft node.
* A draft is a tree given by ``parents`` (``-1`` = the root, otherwise the index of an earlier node). A chain is
  the tree ``parents = [-1, 0, 1, ...]``.
* Chains go through the model's own causal (and sliding-window) masks; trees pass transformers' 4-D attention
  mask (a dict per layer type for models that mix full and sliding-window layers) and explicit position ids.
  No model code is forked.
* Rollback: :func:`keep` drops rejected entries from the cache (a length change for chains; for a tree path, the
  accepted rows move down -- see :mod:`specdec_cli.runtime.kvcache`).
* Logits only where they are read: a prefill asks for none (``keep=0``), a draft model for its last row.
"""

from __future__ import annotations

import inspect
from functools import lru_cache

import torch

from . import static_cache as fastpath
from . import kernels
from . import kvcache
from .positions import ancestor_matrix, depths, is_chain

NO_ROWS = torch.empty(0, dtype=torch.long)


def new_cache(model=None, capacity: int = kvcache.MIN_CAPACITY, fast: str = "off", slot: str = "target"):
    """The KV cache for one generation: a growing one (eager, ``fast="off"``), or the model's static cache with
    bucketed forwards, eager (``"static"``) or compiled (``"compiled"``) -- :mod:`specdec_cli.runtime.static_cache`."""
    if fast == "off" or model is None:
        return kvcache.new_cache(model, capacity)
    return fastpath.cache_for(model, capacity, compiled=fast == "compiled", slot=slot)


def cache_len(cache) -> int:
    return cache.get_seq_length()


def input_device(model) -> torch.device:
    return model.get_input_embeddings().weight.device


@lru_cache(maxsize=None)
def _takes_logits_to_keep(forward_type) -> bool:
    return "logits_to_keep" in inspect.signature(forward_type.forward).parameters


def _rows_arg(model, keep: int | None) -> dict:
    """``logits_to_keep`` for the last ``keep`` rows (None: all; 0: none -- an empty index list)."""
    if keep is None or not _takes_logits_to_keep(type(model)):
        return {}
    return {"logits_to_keep": NO_ROWS if keep == 0 else keep}


@torch.inference_mode()
def forward_chain(model, cache, tokens: list[int], keep: int | None = None) -> torch.Tensor:
    """Feed ``tokens`` after the cached prefix; returns float32 logits of the last ``keep`` rows (None: all rows,
    0: none -- a prefill whose logits nobody reads; the LM head is then skipped entirely)."""
    if isinstance(cache, fastpath.StaticCache):
        return cache.forward_chain(tokens, keep)
    start = cache_len(cache)
    dev = input_device(model)
    ids = torch.tensor([tokens], dtype=torch.long, device=dev)
    pos = torch.arange(start, start + len(tokens), device=dev).unsqueeze(0)
    with kernels.active():
        out = model(input_ids=ids, position_ids=pos, past_key_values=cache, use_cache=True, **_rows_arg(model, keep))
    return out.logits[0].float()


def _text_config(model):
    return model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config


def tree_masks(model, cache, prefix_len: int, parents: list[int], device, dtype) -> tuple[object, torch.Tensor]:
    """The 4-D additive attention mask(s) and position ids for ``root + tree`` after ``prefix_len`` cached tokens.

    Models that mix full and sliding-window layers get a dict per layer type. A sliding-window mask covers the
    cached entries its cache layers show (:mod:`specdec_cli.runtime.kvcache` shows only the last ``window - 1``) and masks,
    row by row, whatever lies beyond that row's own window."""
    anc = ancestor_matrix(parents)
    n = anc.shape[0]
    q_pos = prefix_len + torch.tensor([0] + depths(parents))
    neg = torch.finfo(dtype).min

    def additive(start: int, window: int | None) -> torch.Tensor:
        m = torch.zeros(n, prefix_len - start + n, dtype=dtype)
        m[:, prefix_len - start:].masked_fill_(~anc, neg)
        if window is not None:
            k_pos = torch.cat([torch.arange(start, prefix_len), q_pos])
            m.masked_fill_((q_pos[:, None] - k_pos[None, :]) >= window, neg)
        return m[None, None].to(device)

    cfg = _text_config(model)
    layer_types, window = getattr(cfg, "layer_types", None), getattr(cfg, "sliding_window", None)
    if not (layer_types and window and "sliding_attention" in layer_types):
        return additive(0, None), q_pos.unsqueeze(0).to(device)
    windowed = any(getattr(layer, "window", None) for layer in cache.layers)
    start = max(prefix_len - window + 1, 0) if windowed else 0
    mask = {t: additive(start, window) if t == "sliding_attention" else additive(0, None) for t in set(layer_types)}
    return mask, q_pos.unsqueeze(0).to(device)


@torch.inference_mode()
def forward_tree(model, cache, root: int, draft_tokens: list[int], parents: list[int]) -> torch.Tensor:
    """Feed the root token and a draft tree in one pass; returns logits ``[1 + n, V]`` (row 0 = root)."""
    if isinstance(cache, fastpath.StaticCache):
        return cache.forward_tree(root, draft_tokens, parents)
    if is_chain(parents):
        return forward_chain(model, cache, [root, *draft_tokens])
    dev = input_device(model)
    mask, pos = tree_masks(model, cache, cache_len(cache), parents, dev, model.dtype)
    ids = torch.tensor([[root, *draft_tokens]], dtype=torch.long, device=dev)
    with kernels.active():
        out = model(input_ids=ids, position_ids=pos, attention_mask=mask, past_key_values=cache, use_cache=True)
    return out.logits[0].float()


def crop(cache, length: int) -> None:
    """Roll the cache back to its first ``length`` entries (transformers v5: ``crop(-n)`` removes ``n``)."""
    excess = cache_len(cache) - length
    if excess > 0:
        cache.crop(-excess)


def keep(cache, prefix_len: int, rows: list[int]) -> None:
    """Keep ``cache[:prefix_len]`` plus the entries at ``prefix_len + r`` for each ``r`` in ``rows`` (ascending)."""
    if rows == list(range(len(rows))):
        crop(cache, prefix_len + len(rows))
        return
    for layer in cache.layers:
        if hasattr(layer, "keep_rows"):
            layer.keep_rows(prefix_len, rows)
        elif getattr(layer, "keys", None) is not None and layer.keys.numel():
            idx = torch.tensor(list(range(prefix_len)) + [prefix_len + r for r in rows], device=layer.keys.device)
            layer.keys = layer.keys.index_select(-2, idx)
            layer.values = layer.values.index_select(-2, idx)
