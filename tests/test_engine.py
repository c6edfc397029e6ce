"""Engine: tree forward == chain forward, cache rollback, exact acceptance rules."""

from __future__ import annotations

import random

import pytest
import torch

from specdec_cli.runtime import forward as engine
from specdec_cli.runtime.cache_mode import CacheMode
from specdec_cli.engine.loop import Drafter, generate
from specdec_cli.engine.sampling import SamplingConfig, logits_to_probs, pick
from specdec_cli.engine.verify import verify_rejection, verify_tree

from conftest import assert_tree_rows_match_chains, chain_logits, chisquare_pvalue, tiny_gemma3, tiny_llama


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


WARPERS = [SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.8, top_k=3),
           SamplingConfig(temperature=0.8, top_p=0.7)]
WARPER_IDS = ["t1", "top-k", "top-p"]


@pytest.mark.parametrize("cfg", WARPERS, ids=WARPER_IDS)
def test_verify_rejection_is_exact(cfg):
    """Chi-square: the first two emitted tokens of rejection sampling (a two-token chain; after a rejection the
    second is the next step's draw) are distributed as p_target, with the target's row of the second position
    depending on the first token. Mutation check: warping (top-k/top-p) only row 0 of the target's logits fails
    (draws of tokens outside the top-k / nucleus at the second position)."""
    gen = torch.Generator().manual_seed(0)
    v = 5
    l0, l1 = torch.randn(v, generator=gen) * 2, torch.randn(v, v, generator=gen) * 2  # l1[a]: after token a
    q0 = torch.softmax(torch.randn(v, generator=gen) * 2, -1)
    q1 = torch.softmax(torch.randn(v, v, generator=gen) * 2, -1)
    counts = torch.zeros(v, v)
    n = 20000
    for _ in range(n):
        x0 = int(torch.multinomial(q0, 1, generator=gen))
        x1 = int(torch.multinomial(q1[x0], 1, generator=gen))
        logits = torch.stack([l0, l1[x0], torch.zeros(v)])
        path, nxt = verify_rejection(logits, [x0, x1], torch.stack([q0, q1[x0]]), cfg, gen)
        out = [x0, x1][: len(path)] + [nxt]
        if len(out) < 2:  # rejected at once: the next step draws the second token from the target
            out.append(pick(l1[out[0]], cfg, gen))
        counts[out[0], out[1]] += 1
    expected = logits_to_probs(l0, cfg)[:, None] * logits_to_probs(l1, cfg)
    assert chisquare_pvalue(counts, expected) > 1e-3


@pytest.mark.parametrize("cfg", WARPERS[1:], ids=WARPER_IDS[1:])
def test_verify_tree_sampling_is_exact(cfg):
    """Deterministic tree drafts: the first two emitted tokens are distributed as p_target. Every token has a
    node under the root, each with two children, so the second token is always drawn at a node below the root.
    Mutation checks (each fails): top-k/top-p ignored below the root (draws outside the top-k / nucleus); a node
    below the root choosing one of its children uniformly instead of drawing from the target."""
    gen = torch.Generator().manual_seed(1)
    v = 5
    tokens = list(range(v)) + [t for a in range(v) for t in ((a + 1) % v, (a + 3) % v)]
    parents = [-1] * v + [a for a in range(v) for _ in range(2)]  # node a (token a) is the root's child a
    logits = torch.randn(1 + len(tokens), v, generator=gen) * 2
    counts = torch.zeros(v, v)
    n = 20000
    for _ in range(n):
        path, nxt = verify_tree(logits, tokens, parents, cfg, gen)
        out = [tokens[i] for i in path] + [nxt]
        counts[out[0], out[1]] += 1
    expected = logits_to_probs(logits[0], cfg)[:, None] * logits_to_probs(logits[1 : v + 1], cfg)
    assert chisquare_pvalue(counts, expected) > 1e-3


def test_top_p_keeps_smallest_nucleus():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    p = logits_to_probs(logits, SamplingConfig(temperature=1.0, top_p=0.8))
    assert torch.allclose(p, torch.tensor([0.5, 0.3, 0.0, 0.0]) / 0.8)


class RandomChainDrafter(Drafter):
    """A draft model drafter over a tiny random model (sd without the registry)."""

    def __init__(self, draft_model, k):
        from specdec_cli.methods.sd import SpeculativeSampling
        from specdec_cli.io.models import LoadedModel

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


def sd_two_token_pvalue(target, draft, n: int = 1500, cache_mode: CacheMode = CacheMode.EAGER) -> float:
    """Chi-square p-value of the first two tokens sd samples (n seeds) against the target's exact law
    (``cache_mode``: the engine path of the target, :mod:`specdec_cli.runtime.cache_mode`)."""
    cfg = SamplingConfig(temperature=1.0)
    prompt = [1, 4, 2]
    expected = exact_two_token_distribution(target, prompt, cfg).cpu()
    drafter = RandomChainDrafter(draft, k=3)
    counts = torch.zeros(64)
    for seed in range(n):
        out = generate(target, prompt, drafter, max_new_tokens=2, sampling=cfg, seed=seed, cache_mode=cache_mode).tokens
        counts[out[0] * 8 + out[1]] += 1
    return chisquare_pvalue(counts, expected)


def test_sd_sampling_preserves_target_distribution():
    """End to end on a tiny random model: the first two sampled tokens of sd follow the target's law."""
    assert sd_two_token_pvalue(tiny_llama(seed=0), tiny_llama(seed=1)) > 1e-3


def test_generate_respects_budget_and_stop_ids():
    target = tiny_llama(seed=0)
    ar = generate(target, [1, 2], Drafter(), max_new_tokens=12)
    identical = generate(target, [1, 2], RandomChainDrafter(tiny_llama(seed=0), k=4), max_new_tokens=12)
    assert identical.tokens == ar.tokens and identical.summary()["acceptance_rate"] == 1.0
    assert len(identical.steps) < len(ar.steps)
    drafter = RandomChainDrafter(tiny_llama(seed=1), k=4)  # another model: some drafts are rejected
    res = generate(target, [1, 2], drafter, max_new_tokens=12)
    s = res.summary()
    assert res.tokens == ar.tokens and len(res.tokens) == 12
    assert 0 < s["accepted"] < s["drafted"]
    assert s["new_tokens"] == sum(step.new_tokens for step in res.steps) == s["accepted"] + s["target_forwards"]
    stop = ar.tokens[3]
    res = generate(target, [1, 2], drafter, max_new_tokens=12, stop_ids={stop})
    assert res.tokens == ar.tokens[: ar.tokens.index(stop)] and res.stopped_by == "eos"
