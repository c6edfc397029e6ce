"""Which models the lean forward (:mod:`specdec_cli.runtime.decoder`) computes exactly as their own code does:
the architectures it knows, and the setups whose numbers it reproduces."""

from __future__ import annotations

import math

ARCHS = {"LlamaForCausalLM": "llama", "Gemma3ForCausalLM": "gemma3"}


def supported(model) -> bool:
    """Whether the lean forward computes what ``model``'s own forward computes: a known architecture on one device (no
    accelerate hooks), SDPA attention, rotary tables that do not depend on the sequence's length, no options the
    lean path does not implement."""
    kind = ARCHS.get(type(model).__name__)
    if kind is None:
        return False
    cfg = text_config(model)
    if getattr(cfg, "_attn_implementation", None) != "sdpa":  # eager differs in bf16; others are other kernels
        return False
    if getattr(cfg, "attn_logit_softcapping", None) or getattr(cfg, "use_bidirectional_attention", False):
        return False
    if kind == "llama" and getattr(cfg, "pretraining_tp", 1) != 1:
        return False
    if not _static_rope(getattr(cfg, "rope_parameters", None)):
        return False
    if len(set(getattr(model, "hf_device_map", {}).values())) > 1 or \
            any(hasattr(m, "_hf_hook") for m in model.modules()):  # split across devices, or offloaded
        return False
    scaling = getattr(model.model.layers[0].self_attn, "scaling", None)
    return scaling is not None and not math.isnan(scaling) and hasattr(model, "lm_head")


def text_config(model):
    """The config of ``model``'s text part (a multimodal config's ``get_text_config()``; else the config)."""
    return model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config


def _static_rope(params) -> bool:
    """Whether the rotary embedding of every position is fixed (``dynamic``/``longrope`` rescale with the length,
    so a table made once would be wrong). ``params``: the config's ``rope_parameters`` (per layer type for Gemma)."""
    if not params:
        return True
    kinds = [params] if "rope_type" in params or "rope_theta" in params else list(params.values())
    return not any(k and ("dynamic" in str(k.get("rope_type", "")) or k.get("rope_type") == "longrope")
                   for k in kinds)
