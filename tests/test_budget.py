"""The draft budget: tree selection, calibration, the drafting gate, and exactness with the budget on."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from specdec_cli import trees
from specdec_cli.budget import Budget, Calibrator, parse_budget
from specdec_cli.decoding import Drafter, generate
from specdec_cli.errors import SpecdecError
from specdec_cli.hardware import Profile
from specdec_cli.sampling import SamplingConfig

from conftest import tiny_llama
from test_engine import exact_two_token_distribution

STEEP = Profile([1, 2, 3, 4, 8], [1.0, 1.05, 1.1, 2.0, 6.0])  # three draft tokens nearly free, then expensive


def random_tree(rng: random.Random, n: int) -> tuple[list[int], list[int], list[float]]:
    parents = [-1] + [rng.randrange(-1, i) for i in range(1, n)]
    return [rng.randrange(50) for _ in range(n)], parents, [rng.random() for _ in range(n)]


@pytest.mark.parametrize("seed", range(20))
def test_selection_is_prefix_closed_and_keeps_the_likeliest(seed):
    rng = random.Random(seed)
    tokens, parents, cond = random_tree(rng, rng.randrange(1, 40))
    draft = trees.Draft(tokens, parents, scores=cond)
    kept = trees.select(draft, np.array(cond), STEEP, value_per_s=0.5)
    assert all(p < i for i, p in enumerate(kept.parents))  # re-indexed, parents first
    probs = trees.path_probs(parents, cond)
    chosen = trees.rank(parents, probs)[: len(kept)]
    assert sorted(kept.tokens) == sorted(tokens[i] for i in chosen)
    for i in chosen:  # prefix-closed: every ancestor of a kept node is kept
        assert parents[i] < 0 or parents[i] in set(chosen.tolist())


def test_selection_can_be_empty_and_grows_with_cheap_verification():
    draft = trees.Draft.chain([1, 2, 3, 4, 5], scores=[0.3] * 5)
    cond = np.full(5, 0.3)
    assert len(trees.select(draft, cond, Profile([1, 2], [1.0, 2.0]), value_per_s=1.0)) == 0
    assert len(trees.select(draft, cond, Profile.flat(), value_per_s=1.0)) == 5
    assert len(trees.select(draft, cond, STEEP, value_per_s=1.0)) == 2  # gains 0.3 and 0.09 beat 0.05 each


@pytest.mark.parametrize("seed", range(30))
def test_causal_cut_never_looks_ahead(seed):
    """Whether chain node i is kept depends only on nodes <= i: what rejection sampling needs to stay exact."""
    rng = np.random.default_rng(seed)
    probs = np.cumprod(rng.uniform(0.2, 1.0, size=12))
    value = rng.uniform(0.1, 3.0)
    full = trees.causal_size(probs, STEEP, value)
    for m in range(len(probs) + 1):
        assert trees.causal_size(probs[:m], STEEP, value) == min(full, m)


def test_calibrator_learns_that_a_drafter_is_underconfident():
    cal = Calibrator()
    draft = trees.Draft.chain([1, 2, 3], scores=[0.1, 0.1, 0.1])
    before = cal.estimate([1, 2, 3], [0.1] * 3)
    for _ in range(30):
        cal.observe(draft, [0, 1, 2])  # always fully accepted
    after = cal.estimate([1, 2, 3], [0.1] * 3)
    assert np.all(after > 0.8) and np.all(before < 0.2)
    assert cal.estimate([1], [0.15])[0] > 0.5  # the global rescaling reaches unseen cells too


def test_parse_budget():
    assert parse_budget(None) == "auto" and parse_budget("paper") == "paper" and parse_budget("7") == 7
    for bad in ("lots", "-1"):
        with pytest.raises(SpecdecError):
            parse_budget(bad)


class UselessDrafter(Drafter):
    """Proposes a token the target never picks, and takes its time doing so."""

    def __init__(self, token: int):
        self.token = token

    def propose(self, tokens, max_tokens):
        import time

        time.sleep(0.002)
        k = min(3, max_tokens)
        return trees.Draft.chain([self.token] * k, scores=[0.9] * k)


def test_gate_turns_a_losing_drafter_into_plain_decoding():
    target = tiny_llama(vocab=64, seed=3)
    ar = generate(target, [1, 2, 3], Drafter(), max_new_tokens=40).tokens
    drafter = UselessDrafter(next(t for t in range(64) if t not in ar))
    drafter.budget = Budget("auto", Profile([1, 2, 4], [0.001, 0.0012, 0.0015]))
    res = generate(target, [1, 2, 3], drafter, max_new_tokens=40)
    assert res.tokens == ar
    assert res.extra["gated_steps"] > 20  # most steps no longer draft at all


def tiny_sd(seed: int, window: int):
    from specdec_cli.methods.sd import SpeculativeSampling
    from specdec_cli.models import LoadedModel

    sd = SpeculativeSampling(LoadedModel(tiny_llama(seed=seed), None, "tiny-draft", False), 8, window=window)
    sd.dm._profile = Profile([1, 2], [0.2, 0.2])  # a draft forward costs a fifth of a target one
    return sd


def test_fixed_budget_caps_the_draft():
    target = tiny_llama(seed=0)
    ar = generate(target, [1, 2], Drafter(), max_new_tokens=12).tokens
    sd = tiny_sd(seed=0, window=6)  # the same weights: every token accepted
    sd.budget = Budget(2)
    res = generate(target, [1, 2], sd, max_new_tokens=12)
    assert res.tokens == ar and max(s.drafted for s in res.steps) == 2


def two_token_pvalue(make_drafter, n: int = 1500) -> float:
    target = tiny_llama(seed=0)
    cfg = SamplingConfig(temperature=1.0)
    prompt = [1, 4, 2]
    expected = exact_two_token_distribution(target, prompt, cfg)
    drafter = make_drafter()
    counts = torch.zeros(64)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for seed in range(n):
            out = generate(target, prompt, drafter, max_new_tokens=3, sampling=cfg, seed=seed).tokens
            counts[out[0] * 8 + out[1]] += 1
    finally:
        torch.set_num_threads(threads)
    keep = expected * n >= 5
    obs = torch.cat([counts[keep], counts[~keep].sum().view(1)])
    exp = torch.cat([expected[keep] * n, (expected[~keep] * n).sum().view(1)])
    return chisquare(obs.numpy(), exp.numpy() * obs.sum().item() / exp.sum().item()).pvalue


def test_sd_sampling_is_exact_with_the_budget_on():
    """Chains cut by the budget (extend + causal selection + gate) still sample exactly from p_target."""

    def make():
        sd = tiny_sd(seed=1, window=5)
        sd.budget = Budget("auto", STEEP)
        return sd

    assert two_token_pvalue(make) > 1e-3


class RandomTreeDrafter(Drafter):
    """Deterministic-given-the-context random trees with random scores (a retrieval drafter stand-in)."""

    def propose(self, tokens, max_tokens):
        rng = random.Random(hash(tuple(tokens)))
        n = min(rng.randrange(1, 9), max_tokens)
        parents = [-1] + [rng.randrange(-1, i) for i in range(1, n)]
        return trees.Draft([rng.randrange(8) for _ in range(n)], parents, scores=[rng.random() for _ in range(n)])


def test_tree_sampling_is_exact_with_the_budget_on():
    def make():
        d = RandomTreeDrafter()
        d.budget = Budget("auto", STEEP)
        return d

    assert two_token_pvalue(make) > 1e-3
