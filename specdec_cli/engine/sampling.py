"""Sampling settings and the few lines of math every method shares.

``temperature == 0`` means greedy decoding. For sampling, the target's and the draft's logits are both
turned into distributions by the same warper (temperature, then top-k, then top-p), and losslessness is
defined against that warped target distribution ``p_target`` -- exactly what autoregressive sampling
with the same settings draws from.
"""

from __future__ import annotations

import torch

from ..config import SamplingConfig  # noqa: F401 - re-exported: the settings are checked without torch


def logits_to_probs(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """Warp ``[..., V]`` logits into probabilities (float32). Greedy gives a one-hot on the argmax."""
    logits = logits.float()
    if cfg.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = logits / cfg.temperature
    if cfg.top_k > 0 and cfg.top_k < logits.shape[-1]:
        kth = torch.topk(logits, cfg.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if cfg.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop_sorted = (cum - sorted_logits.softmax(-1)) >= cfg.top_p  # keep the smallest set reaching top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """Draw one token id from a 1-D distribution."""
    return int(torch.multinomial(probs.float().cpu(), 1, generator=generator))


def pick(logits: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator | None) -> int:
    """Next token from 1-D logits: argmax when greedy, otherwise a draw from the warped distribution."""
    if cfg.greedy:
        return int(logits.argmax())
    return sample(logits_to_probs(logits, cfg), generator)


def entropy(probs: torch.Tensor) -> torch.Tensor:
    """Shannon entropy (nats) over the last dimension."""
    p = probs.float()
    return -(p * torch.log(p.clamp_min(1e-30))).sum(-1)


class Draws:
    """Random draws keyed by (seed, position): the token at position ``t`` of a sequence is drawn with
    :meth:`at` ``(t)``, however the steps that reach ``t`` were cut -- so a sampled sequence is the same whether it
    decodes alone or in a batch, with any batch size, and (for drafts fixed before the target draws) whatever was
    drafted. Each position has its own stream: the draws stay independent."""

    def __init__(self, seed: int):
        self.seed = int(seed)

    def at(self, position: int) -> torch.Generator:
        return torch.Generator().manual_seed((self.seed * 0x9E3779B1 + position * 0x85EBCA77 + 1) % (1 << 63))


def uniform(generator: torch.Generator | None) -> float:
    return float(torch.rand(1, generator=generator))
