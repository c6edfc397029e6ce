"""Engine: tree forward == chain forward, cache rollback, exact acceptance rules."""

from __future__ import annotations

import random

import pytest
import torch
from scipy.stats import chisquare

from specdec_cli import engine
from specdec_cli.decoding import Drafter, generate
from specdec_cli.sampling import SamplingConfig, logits_to_probs
from specdec_cli.verify import verify_rejection, verify_tree

from conftest import assert_tree_rows_match_chains, chain_logits, tiny_gemma3, tiny_llama


@pytest.mark.parametrize("make", [tiny_llama, tiny_gemma3])
@pytest.mark.parametrize("windowed", [False, True])
def test_tree_forward_matches_chain_forward(make, windowed):
    """Each tree node sees exactly its ancestors, at the right positions (incl. sliding windows, whether the
    cache shows sliding layers all of it or only their window; a tiny capacity makes the buffers grow)."""
    model = make(vocab=16)
    prefix = [random.Random(1).randrange(16) for _ in range(9)]  # longer than the sliding window
    tokens = [3, 5, 7, 5, 2, 9, 1]
    parents = [-1, -1, 0, 0, 1, 3, 5]
    cache = engine.new_cache(model if windowed else None, capacity=1)
    engine.forward_chain(model, cache, prefix[:-1])
    tree = engine.forward_tree(model, cache, prefix[-1], tokens, parents)
    assert torch.allclose(tree[0], chain_logits(model, prefix)[-1], atol=1e-5)
    assert_tree_rows_match_chains(model, prefix, tokens, parents, tree, atol=1e-5)


@pytest.mark.parametrize("make", [tiny_llama, tiny_gemma3])
@pytest.mark.parametrize("windowed", [False, True])
def test_cache_rollback_to_tree_path(make, windowed):
    """After keeping a tree path, the cache is the one a chain over that path would have built."""
    model = make(vocab=16)
    prefix = [1, 2, 3, 4, 5, 6, 7]
    tokens, parents = [8, 9, 10, 11, 12], [-1, -1, 1, 2, 2]
    cache = engine.new_cache(model if windowed else None, capacity=1)
    engine.forward_chain(model, cache, prefix[:-1])
    engine.forward_tree(model, cache, prefix[-1], tokens, parents)
    engine.keep(cache, len(prefix) - 1, [0, 2, 3, 5])  # root -> node 1 -> node 2 -> node 4
    assert engine.cache_len(cache) == len(prefix) + 3
    after = engine.forward_chain(model, cache, [13])[-1]
    expected = chain_logits(model, prefix + [9, 10, 12, 13])[-1]
    assert torch.allclose(after, expected, atol=1e-5)


def test_crop_rolls_back_chain():
    model = tiny_llama(vocab=16)
    cache = engine.new_cache()
    engine.forward_chain(model, cache, [1, 2, 3, 4, 5, 6])
    engine.crop(cache, 3)
    assert engine.cache_len(cache) == 3
    after = engine.forward_chain(model, cache, [9])[-1]
    assert torch.allclose(after, chain_logits(model, [1, 2, 3, 9])[-1], atol=1e-5)


def test_verify_rejection_is_exact():
    """Chi-square: the first emitted token of rejection sampling is distributed as p_target."""
    gen = torch.Generator().manual_seed(0)
    v = 6
    p_logits = torch.randn(2, v, generator=gen) * 2
    q_draft = torch.softmax(torch.randn(1, v, generator=gen) * 2, -1)
    cfg = SamplingConfig(temperature=1.0)
    counts = torch.zeros(v)
    n = 20000
    for _ in range(n):
        x = int(torch.multinomial(q_draft[0], 1, generator=gen))
        path, nxt = verify_rejection(p_logits, [x], q_draft, cfg, gen)
        counts[x if path else nxt] += 1
    p = logits_to_probs(p_logits[0], cfg)
    assert chisquare(counts.numpy(), (p * n).numpy()).pvalue > 1e-3


def test_verify_tree_sampling_is_exact():
    """Deterministic tree drafts: the first emitted token is still distributed as p_target."""
    gen = torch.Generator().manual_seed(1)
    v = 5
    logits = torch.randn(4, v, generator=gen) * 2
    tokens, parents = [0, 3, 1], [-1, -1, 0]
    cfg = SamplingConfig(temperature=0.8, top_k=4)
    counts = torch.zeros(v)
    n = 20000
    for _ in range(n):
        path, nxt = verify_tree(logits, tokens, parents, cfg, gen)
        counts[tokens[path[0]] if path else nxt] += 1
    p = logits_to_probs(logits[0], cfg)
    keep = p > 0
    assert counts[~keep].sum() == 0
    assert chisquare(counts[keep].numpy(), (p[keep] * n).numpy()).pvalue > 1e-3


def test_top_p_keeps_smallest_nucleus():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    p = logits_to_probs(logits, SamplingConfig(temperature=1.0, top_p=0.8))
    assert torch.allclose(p, torch.tensor([0.5, 0.3, 0.0, 0.0]) / 0.8)


class RandomChainDrafter(Drafter):
    """A draft model drafter over a tiny random model (sd without the registry)."""

    def __init__(self, draft_model, k):
        from specdec_cli.methods.sd import SpeculativeSampling
        from specdec_cli.models import LoadedModel

        self.inner = SpeculativeSampling(LoadedModel(draft_model, None, "tiny-draft", False), 8, k)

    def use_target_cache(self, cache):
        self.inner.use_target_cache(cache)

    def start(self, prompt, cfg, generator):
        self.inner.start(prompt, cfg, generator)

    def propose(self, tokens, max_tokens):
        return self.inner.propose(tokens, max_tokens)


def exact_two_token_distribution(model, prompt, cfg):
    p1 = logits_to_probs(chain_logits(model, prompt)[-1], cfg)
    table = torch.zeros(8, 8)
    for a in range(8):
        table[a] = p1[a] * logits_to_probs(chain_logits(model, prompt + [a])[-1], cfg)
    return table.flatten()


def sd_two_token_pvalue(target, draft, n: int = 1500, fast: str = "off") -> float:
    """Chi-square p-value of the first two tokens sd samples (n seeds) against the target's exact law
    (``fast``: the engine path of the target, :mod:`specdec_cli.fastpath`)."""
    cfg = SamplingConfig(temperature=1.0)
    prompt = [1, 4, 2]
    expected = exact_two_token_distribution(target, prompt, cfg).cpu()
    drafter = RandomChainDrafter(draft, k=3)
    counts = torch.zeros(64)
    for seed in range(n):
        out = generate(target, prompt, drafter, max_new_tokens=2, sampling=cfg, seed=seed, fast=fast).tokens
        counts[out[0] * 8 + out[1]] += 1
    keep = expected * n >= 5
    obs = torch.cat([counts[keep], counts[~keep].sum().view(1)])
    exp = torch.cat([expected[keep] * n, (expected[~keep] * n).sum().view(1)])
    return chisquare(obs.numpy(), exp.numpy() * obs.sum().item() / exp.sum().item()).pvalue


def test_sd_sampling_preserves_target_distribution():
    """End to end on a tiny random model: the first two sampled tokens of sd follow the target's law."""
    assert sd_two_token_pvalue(tiny_llama(seed=0), tiny_llama(seed=1)) > 1e-3


def test_generate_respects_budget_and_stop_ids():
    target, draft = tiny_llama(seed=0), tiny_llama(seed=0)  # identical draft: everything accepted
    drafter = RandomChainDrafter(draft, k=4)
    res = generate(target, [1, 2], drafter, max_new_tokens=7)
    assert len(res.tokens) == 7
    ar = generate(target, [1, 2], Drafter(), max_new_tokens=7)
    assert res.tokens == ar.tokens
    assert res.summary()["acceptance_rate"] == 1.0
    stop = ar.tokens[3]
    res = generate(target, [1, 2], drafter, max_new_tokens=7, stop_ids={stop})
    assert res.tokens == ar.tokens[: ar.tokens.index(stop)] and res.stopped_by == "eos"
