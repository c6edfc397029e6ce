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
* Rollback: :func:`keep` drops rejected entries from the cache (``DynamicCache.crop`` for chains, a gather for
  tree paths).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache


def new_cache() -> DynamicCache:
    # No config: every layer is a full ``DynamicLayer`` (sliding-window layers are masked, not truncated), so
    # the cache can always be cropped or gathered, whatever the context length.
    return DynamicCache()


def cache_len(cache: DynamicCache) -> int:
    return cache.get_seq_length()


def input_device(model) -> torch.device:
    return model.get_input_embeddings().weight.device


def is_chain(parents: list[int]) -> bool:
    return all(p == i - 1 for i, p in enumerate(parents))


def chain_parents(n: int) -> list[int]:
    return list(range(-1, n - 1))


def depths(parents: list[int]) -> list[int]:
    out: list[int] = []
    for p in parents:
        out.append(1 if p < 0 else out[p] + 1)
    return out


@torch.inference_mode()
def forward_chain(model, cache: DynamicCache, tokens: list[int]) -> torch.Tensor:
    """Feed ``tokens`` after the cached prefix; returns float32 logits ``[len(tokens), V]`` on the CPU side."""
    start = cache_len(cache)
    dev = input_device(model)
    ids = torch.tensor([tokens], dtype=torch.long, device=dev)
    pos = torch.arange(start, start + len(tokens), device=dev).unsqueeze(0)
    out = model(input_ids=ids, position_ids=pos, past_key_values=cache, use_cache=True)
    return out.logits[0].float()


def ancestor_matrix(parents: list[int]) -> torch.Tensor:
    """``anc[i, j]`` is True when node ``j`` is ``i`` or an ancestor of ``i``; index 0 is the root."""
    n = len(parents) + 1
    anc = torch.zeros(n, n, dtype=torch.bool)
    anc[0, 0] = True
    for i, p in enumerate(parents, start=1):
        if not -1 <= p < i - 1:
            raise ValueError(f"draft tree parents must point to earlier nodes, got parents[{i - 1}] = {p}")
        anc[i] = anc[p + 1]
        anc[i, i] = True
    return anc


def tree_masks(model, prefix_len: int, parents: list[int], device, dtype) -> tuple[object, torch.Tensor]:
    """The 4-D additive attention mask(s) and position ids for ``root + tree`` after ``prefix_len`` cached tokens."""
    anc = ancestor_matrix(parents)
    n = anc.shape[0]
    q_pos = prefix_len + torch.tensor([0] + depths(parents))
    k_pos = torch.cat([torch.arange(prefix_len), q_pos])
    allowed = torch.cat([torch.ones(n, prefix_len, dtype=torch.bool), anc], dim=1)
    neg = torch.finfo(dtype).min

    def additive(ok: torch.Tensor) -> torch.Tensor:
        m = torch.zeros(ok.shape, dtype=dtype).masked_fill(~ok, neg)
        return m[None, None].to(device)

    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    layer_types = getattr(cfg, "layer_types", None)
    window = getattr(cfg, "sliding_window", None)
    if layer_types and window and "sliding_attention" in layer_types:
        in_window = (q_pos[:, None] - k_pos[None, :]) < window
        mask = {t: additive(allowed & in_window if t == "sliding_attention" else allowed) for t in set(layer_types)}
    else:
        mask = additive(allowed)
    return mask, q_pos.unsqueeze(0).to(device)


@torch.inference_mode()
def forward_tree(model, cache: DynamicCache, root: int, draft_tokens: list[int], parents: list[int]) -> torch.Tensor:
    """Feed the root token and a draft tree in one pass; returns logits ``[1 + n, V]`` (row 0 = root)."""
    if is_chain(parents):
        return forward_chain(model, cache, [root, *draft_tokens])
    dev = input_device(model)
    mask, pos = tree_masks(model, cache_len(cache), parents, dev, model.dtype)
    ids = torch.tensor([[root, *draft_tokens]], dtype=torch.long, device=dev)
    out = model(input_ids=ids, position_ids=pos, attention_mask=mask, past_key_values=cache, use_cache=True)
    return out.logits[0].float()


def crop(cache: DynamicCache, length: int) -> None:
    """Roll the cache back to its first ``length`` entries (transformers v5: ``crop(-n)`` removes ``n``)."""
    excess = cache_len(cache) - length
    if excess > 0:
        cache.crop(-excess)


def keep(cache: DynamicCache, prefix_len: int, rows: list[int]) -> None:
    """Keep ``cache[:prefix_len]`` plus the entries at ``prefix_len + r`` for each ``r`` in ``rows`` (in order)."""
    if rows == list(range(len(rows))):
        crop(cache, prefix_len + len(rows))
        return
    for layer in cache.layers:
        if getattr(layer, "keys", None) is None or layer.keys.numel() == 0:
            continue
        idx = torch.tensor(list(range(prefix_len)) + [prefix_len + r for r in rows], device=layer.keys.device)
        layer.keys = layer.keys.index_select(-2, idx)
        layer.values = layer.values.index_select(-2, idx)
