"""One decoder layer's handles and the small tensor operations of :mod:`specdec_cli.runtime.decoder`'s lean
forward: transformers' RMSNorms (Llama's and Gemma's) and rotary embedding, computed as transformers computes them.
"""

from __future__ import annotations

import torch


class Layer:
    """One decoder layer's handles: norm weights, the linear modules' ``forward``, the rotary table it uses."""

    __slots__ = ("norms", "q", "k", "v", "o", "gate", "up", "down", "q_norm", "k_norm", "rope", "act")

    def __init__(self, layer, kind: str, rope: str, wide: bool):
        attn, mlp = layer.self_attn, layer.mlp
        self.q, self.k, self.v, self.o = (m.forward for m in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj))
        self.gate, self.up, self.down = mlp.gate_proj.forward, mlp.up_proj.forward, mlp.down_proj.forward
        self.act = mlp.act_fn
        names = ("input_layernorm", "post_attention_layernorm") if kind == "llama" else \
            ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")
        gemma = kind == "gemma3"
        self.norms = [norm_weights(getattr(layer, n), gemma, wide) for n in names]
        self.q_norm = norm_weights(attn.q_norm, gemma, wide) if hasattr(attn, "q_norm") else None
        self.k_norm = norm_weights(attn.k_norm, gemma, wide) if hasattr(attn, "k_norm") else None
        self.rope = rope


def norm_weights(norm, gemma: bool, wide: bool = False) -> tuple[torch.Tensor, float]:
    """A norm module's (weight, eps) as its forward uses them: Gemma's ``1 + w`` in float32, Llama's ``w`` (in
    float32 for a wide model)."""
    if gemma:
        return 1.0 + norm.weight.detach().float(), norm.eps
    return (norm.weight.detach().float() if wide else norm.weight.detach()), norm.variance_epsilon


def llama_norm(x: torch.Tensor, norm: tuple[torch.Tensor, float]) -> torch.Tensor:
    """transformers' ``LlamaRMSNorm``: normalised in float32, cast back, then scaled."""
    weight, eps = norm
    h = x if x.dtype == torch.float32 else x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * (h if x.dtype == torch.float32 else h.to(x.dtype))


def gemma_norm(x: torch.Tensor, norm: tuple[torch.Tensor, float]) -> torch.Tensor:
    """transformers' ``Gemma3RMSNorm``: normalised and scaled by ``1 + w`` in float32, then cast back."""
    weight, eps = norm
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    h = h * weight
    return h if x.dtype == torch.float32 else h.type_as(x)


def rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """transformers' ``x * cos + rotate_half(x) * sin``: ``rotate_half(x) = cat(-x2, x1)`` is ``roll(x)`` with the
    first half's sign moved into the sine table (exact: a sign flip rounds nothing)."""
    return (x * cos) + (x.roll(x.shape[-1] // 2, -1) * signed_sin)
