"""Which keys a query row sees: layers' sliding windows, and the attention mask of a forward over a draft tree,
built one way for both KV caches.

A forward feeds ``size`` query rows (the root and its draft nodes; a static cache's padding rows too) after
``prefix`` cached entries. Key column ``c`` holds cached position ``c`` when ``c < prefix`` and query row
``c - prefix`` otherwise. A row may see every prefix column and its own tree ancestors (itself included); in a
sliding-window layer only keys less than ``window`` positions before it. The growing cache
(:mod:`specdec_cli.runtime.kvcache`) passes the columns its layers show (a sliding layer's view starts late); the
static cache (:mod:`specdec_cli.runtime.static_cache`) passes its whole buffer and a device-side ``prefix``, inside
its (compiled) forward.
"""

from __future__ import annotations

import torch


def tree_mask(columns: torch.Tensor, prefix, anc: torch.Tensor, q_pos: torch.Tensor, window: int | None,
              dtype: torch.dtype) -> torch.Tensor:
    """Additive mask ``[1, 1, rows, len(columns)]`` (0 visible, the dtype's minimum masked). ``prefix``: an int or
    a 0-d tensor; ``anc``: the ``[size, size]`` ancestor matrix; ``q_pos``: the rows' positions."""
    size = anc.shape[0]
    rel = columns - prefix  # column -> the query row it holds (when in [0, size))
    in_tree = (rel >= 0) & (rel < size)
    row = rel.clamp(0, size - 1)
    visible = (columns < prefix)[None, :] | (anc[:, row] & in_tree[None, :])
    if window:
        k_pos = torch.where(in_tree, q_pos[row], columns)
        visible = visible & ((q_pos[:, None] - k_pos[None, :]) < window)
    return torch.where(visible, 0.0, torch.finfo(dtype).min).to(dtype)[None, None]


def layer_masks(layer_types, window: int | None, mask_for):
    """One mask per layer type (``mask_for(window or None)``): a dict when full and sliding-window layers mix,
    the single mask otherwise -- as transformers' models take ``attention_mask``."""
    masks = {kind: mask_for(window if kind == "sliding_attention" else None) for kind in sorted(set(layer_types))}
    return masks if len(masks) > 1 else next(iter(masks.values()))


def masks_to(mask, device, dtype: torch.dtype | None = None):
    """A mask from :func:`layer_masks` (one tensor, or a dict per layer type) on ``device`` (as ``dtype``: 0 and
    the minimum of a narrower float type stay 0 and masked)."""
    if torch.is_tensor(mask):
        return mask.to(device, dtype)
    return {kind: m.to(device, dtype) for kind, m in mask.items()}


def layer_windows(config) -> list[int | None]:
    """Per decoder layer: its sliding window, or None for full attention (from ``layer_types``/``sliding_window``)."""
    cfg = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    types = getattr(cfg, "layer_types", None)
    window = getattr(cfg, "sliding_window", None)
    n = getattr(cfg, "num_hidden_layers", None)
    if not types or not window:
        return [None] * int(n or 0)
    return [window if t == "sliding_attention" else None for t in types]


def batch_mask(starts: torch.Tensor, anc: torch.Tensor, q_pos: torch.Tensor, end: int, window: int | None,
               dtype: torch.dtype) -> torch.Tensor:
    """Additive mask ``[rows, 1, width, end]``: query ``i`` of row ``b`` sees column ``c`` when ``c`` is in the
    row's prefix (``c < starts[b]``) or holds one of its tree ancestors (itself included); with a ``window``, only
    keys less than ``window`` positions before it. Same rule as :func:`specdec_cli.runtime.masks.tree_mask`."""
    rows, width, _ = anc.shape
    columns = torch.arange(end)
    rel = columns[None, :] - starts[:, None]  # [rows, end]: the query row a column holds, when in [0, width)
    in_tree = (rel >= 0) & (rel < width)
    at = rel.clamp(0, width - 1)
    visible = (rel < 0)[:, None, :] | (torch.gather(anc, 2, at[:, None, :].expand(rows, width, end))
                                       & in_tree[:, None, :])
    if window:
        k_pos = torch.where(in_tree, torch.gather(q_pos, 1, at), columns[None, :])
        visible = visible & ((q_pos[:, :, None] - k_pos[:, None, :]) < window)
    return torch.where(visible, 0.0, torch.finfo(dtype).min).to(dtype)[:, None]


CAUSAL = "causal"  # a layer's mask in a prefill from an empty cache: SDPA's own causal rule, no mask tensor


def plain_causal(n: int, windows: list[int | None]) -> bool:
    """Whether a prefill of ``n`` rows from an empty cache sees, in every layer, exactly the causal rule (no
    sliding window cuts into it): then it passes SDPA ``is_causal`` and no mask is built. Why: SDPA's CPU kernel
    skips the blocks above the diagonal only when told ``is_causal`` (a mask tensor makes it compute and mask
    them): on SmolLM2's 780-token rag prompts, attention is a fifth of the prefill (docs/profiling.md, "16-bit
    prefills"). No row of a prefill is compared with another forward's (``keep=0``), so its order of sums is
    free, as ``widen``'s is."""
    return all(w is None or n <= w for w in windows)


def causal_full_layers(mask):
    """A prefill's masks from an empty cache where windows cut into the prompt (one tensor, or a dict per layer
    type): the full-attention layers take :data:`CAUSAL`, the sliding ones keep their masks."""
    if torch.is_tensor(mask):  # every layer slides
        return mask
    return {kind: m if kind == "sliding_attention" else CAUSAL for kind, m in mask.items()}
