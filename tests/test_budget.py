"""The draft budget: tree selection, calibration, the drafting gate, and exactness with the budget on."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from specdec_cli.engine import trees
from specdec_cli.config import AUTO_BUDGET, PAPER_BUDGET, BudgetSpec, RunSettings
from specdec_cli.engine.budget import Budget, Calibrator
from specdec_cli.engine.loop import Drafter, generate
from specdec_cli.errors import SpecdecError
from specdec_cli.runtime.profile import Profile
from specdec_cli.engine.sampling import SamplingConfig, sample

from conftest import chisquare_pvalue, tiny_llama
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


def test_the_profile_times_both_ends_of_every_kernel_plan_bucket():
    """A plan bucket's strategy serves all its row counts, so t(n) can jump where the next bucket starts (SmolLM2 on
    the Xeon VM: 78 ms at 8 rows, 118 ms at 9). Interpolating across a bucket's start priced those drafts at two
    thirds of their cost; the points must include the first and last count of each bucket the budget prices."""
    from specdec_cli.runtime.kernels import BUCKETS
    from specdec_cli.runtime.profile import POINTS

    from specdec_cli.methods import METHODS

    widest = METHODS["auto"].options["max_nodes"].default + 1  # auto's widest forward: its nodes and the root
    assert max(POINTS) >= widest - 1  # beyond the last point only a short extrapolation
    starts = [1] + [b + 1 for b in BUCKETS if b < max(POINTS)]
    assert set(b for b in BUCKETS if b <= max(POINTS)) <= set(POINTS)
    assert set(starts) <= set(POINTS)
    stepped = Profile([1, 8, 9, 16], [0.06, 0.08, 0.12, 0.13])
    assert stepped(8.5) == pytest.approx(0.10)  # between the two ends of a jump: no cheaper row sneaks in
    assert stepped(20) > stepped(16)  # extrapolated with the last bucket's slope


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
    assert BudgetSpec.parse(None) == AUTO_BUDGET and BudgetSpec.parse("auto").adaptive
    assert BudgetSpec.parse("paper") == PAPER_BUDGET and BudgetSpec.parse("paper").paper
    assert BudgetSpec.parse("7").limit == 7 == BudgetSpec.parse(7).limit and BudgetSpec.parse(0).limit == 0
    assert not BudgetSpec.parse("7").adaptive and not BudgetSpec.parse("7").paper
    for bad in ("lots", "-1", -1):
        with pytest.raises(SpecdecError):
            BudgetSpec.parse(bad)


def test_budget_spec_reads_back_as_written():
    """Records, checkpoints and the CLI keep today's spellings: "auto", "paper" or the integer."""
    for spelling, as_json in (("auto", "auto"), ("paper", "paper"), ("16", 16), (16, 16), ("0", 0)):
        spec = BudgetSpec.parse(spelling)
        assert spec.to_json() == as_json and str(spec) == str(as_json)
        assert BudgetSpec.parse(spec.to_json()) == spec and BudgetSpec.parse(spec) is spec
    assert RunSettings(budget="16").to_json()["budget"] == 16 and RunSettings().to_json()["budget"] == "auto"
    assert Budget("paper").mode == PAPER_BUDGET and Budget(3).stats()["budget"] == 3


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


def test_a_drafter_gated_on_earlier_prompts_is_probed_early_in_a_new_one():
    """A badly losing drafter keeps its backoff across greedy generations, but its gated stretch no longer runs on
    through a whole new prompt (pld on Gemma-3's held-out edits drafted nothing after the first prompt)."""
    budget = Budget("auto", Profile([1, 2, 4], [0.001, 0.0012, 0.0015]))
    budget.net, budget.skip, budget.backoff = -5.0, 3000, 64
    budget.start(sampled=False)
    assert budget.skip == 8 and budget.backoff == 64 and budget.net == -5.0
    budget.net = -0.1  # lost only a little: a fresh start
    budget.start(sampled=False)
    assert budget.skip == 0 and budget.backoff == 1
    costly = Budget("auto", Profile([1, 2, 4], [0.001, 0.0012, 0.0015]), cheap_probe=False)
    costly.net, costly.skip, costly.backoff = -5.0, 3000, 64
    costly.start(sampled=False)  # a probe would first prefill a draft model: its stretch runs on
    assert costly.skip == 3000


def test_model_drafters_say_their_probes_prefill():
    from specdec_cli.methods.hsddw import Hsddw
    from specdec_cli.methods.pld import PromptLookup
    from specdec_cli.methods.sd import SpeculativeSampling
    from specdec_cli.methods.self_verify import SelfVerify

    assert SpeculativeSampling.probe_prefills and Hsddw.probe_prefills and SelfVerify.probe_prefills
    assert not PromptLookup.probe_prefills


def tiny_sd(seed: int, window: int):
    from specdec_cli.methods.sd import SpeculativeSampling
    from specdec_cli.io.models import LoadedModel

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


TOP_K = SamplingConfig(temperature=0.7, top_k=3)
TOP_P = SamplingConfig(temperature=0.7, top_p=0.8)


def two_token_pvalue(make_drafter, cfg: SamplingConfig = SamplingConfig(temperature=1.0), n: int = 1500,
                     max_new_tokens: int = 3, steps=None) -> float:
    """Chi-square p-value of the first two tokens ``generate`` samples after ``[1, 4, 2]`` (``n`` seeds) against
    the target's exact law under ``cfg``; ``steps`` (a list) collects each generation's ``StepStats``."""
    target = tiny_llama(seed=0)
    prompt = [1, 4, 2]
    expected = exact_two_token_distribution(target, prompt, cfg)
    drafter = make_drafter()
    counts = torch.zeros(64)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for seed in range(n):
            res = generate(target, prompt, drafter, max_new_tokens=max_new_tokens, sampling=cfg, seed=seed)
            counts[res.tokens[0] * 8 + res.tokens[1]] += 1
            if steps is not None:
                steps.append(res.steps)
    finally:
        torch.set_num_threads(threads)
    return chisquare_pvalue(counts, expected)


@pytest.mark.parametrize("cfg", [TOP_K, TOP_P], ids=["top-k", "top-p"])
def test_sd_sampling_is_exact_with_the_budget_on(cfg):
    """Chains cut by the budget (extend + causal selection + gate) still sample exactly from p_target, with the
    warpers applied at every position: the first two tokens are counted, and the first step accepts a draft token
    in a good share of the generations, so the second is often drawn from the target's row below the root.
    Mutation check: warping (top-k/top-p) only row 0 in ``verify_rejection`` fails (draws outside the top-k /
    nucleus)."""

    def make():
        sd = tiny_sd(seed=1, window=5)
        sd.budget = Budget("auto", STEEP)
        return sd

    steps = []
    assert two_token_pvalue(make, cfg, n=1000, steps=steps) > 1e-3
    assert sum(s[0].accepted >= 1 for s in steps) > 200


class TopTreeDrafter(Drafter):
    """A tree from a draft model's likeliest tokens (an EAGLE/Medusa-style tree; deterministic given the context):
    its ``widths[0]`` likeliest next tokens, under each its ``widths[1]`` likeliest, ... depth first, scored with
    the draft's own (sharpened) probabilities."""

    def __init__(self, model, widths=(3, 2)):
        self.model, self.widths, self.memo = model, widths, {}

    def top(self, context: tuple, width: int):
        if context not in self.memo:
            from specdec_cli.runtime import forward as engine

            logits = engine.forward_chain(self.model, engine.new_cache(), list(context))[-1]
            self.memo[context] = torch.topk((logits * 2).softmax(-1), width)
        return self.memo[context]

    def propose(self, tokens, max_tokens):
        draft = trees.Draft([], [], scores=[])

        def grow(parent: int, context: tuple, depth: int) -> None:
            if depth == len(self.widths):
                return
            top = self.top(context, self.widths[depth])
            for p, t in zip(top.values.tolist(), top.indices.tolist()):
                draft.tokens.append(t)
                draft.parents.append(parent)
                draft.scores.append(p)
                grow(len(draft.tokens) - 1, context + (t,), depth + 1)

        grow(-1, tuple(tokens), 0)
        return draft.subtree(range(min(len(draft), max_tokens)))


FOUR = Profile([1, 5, 9], [1.0, 1.1, 3.0])  # four draft tokens nearly free, then expensive


@pytest.mark.parametrize("cfg", [TOP_K, TOP_P], ids=["top-k", "top-p"])
def test_tree_sampling_is_exact_with_the_budget_on(cfg):
    """Trees cut by the budget sample exactly from p_target with the warpers applied at every node: the first two
    tokens are counted, and the first step descends below the root in most generations. Mutation checks (each
    fails): top-k/top-p ignored below the root in ``verify_tree`` (draws outside the top-k / nucleus); a node
    below the root choosing one of its children uniformly instead of drawing from the target."""

    def make():
        d = TopTreeDrafter(tiny_llama(seed=0))
        d.budget = Budget("auto", FOUR)
        return d

    steps = []
    assert two_token_pvalue(make, cfg, n=1000, max_new_tokens=5, steps=steps) > 1e-3
    assert sum(s[0].accepted >= 1 for s in steps) > 600


class RandomTreeDrafter(Drafter):
    """Deterministic-given-the-context random trees with random scores (a retrieval drafter stand-in)."""

    def propose(self, tokens, max_tokens):
        rng = random.Random(hash(tuple(tokens)))
        n = min(rng.randrange(1, 9), max_tokens)
        parents = [-1] + [rng.randrange(-1, i) for i in range(1, n)]
        return trees.Draft([rng.randrange(8) for _ in range(n)], parents, scores=[rng.random() for _ in range(n)])


def test_random_tree_sampling_is_exact_with_the_budget_on():
    def make():
        d = RandomTreeDrafter()
        d.budget = Budget("auto", STEEP)
        return d

    assert two_token_pvalue(make) > 1e-3


class BigramDrafter(Drafter):
    """A confident bigram draft model with a negligible drafting cost: it samples a chain of ``window`` tokens from
    ``q[last token]`` (the budget never stops it early) and scores each node with its own confidence ``max q``."""

    def __init__(self, q: torch.Tensor, window: int = 6):
        self.q, self.window = q, window

    def propose(self, tokens, max_tokens):
        chain, rows, last = [], [], tokens[-1]
        for _ in range(min(self.window, max_tokens)):
            rows.append(self.q[last])
            last = sample(rows[-1], self.generator)
            chain.append(last)
        return trees.Draft.chain(chain, torch.stack(rows), [float(r.max()) for r in rows]) if chain else trees.Draft()


def test_causal_cut_of_long_sampled_chains_is_exact():
    """The budget cuts long sampled chains, and rejection sampling stays exact because the cut is causal.

    The draft over-drafts token 6 after the prompt (q = 0.5 against the target's 0.04) and is confident (0.93)
    after a 6, unsure (uniform) after anything else; the first draft token costs a whole forward, the next seven
    nearly nothing. Whether a chain pays for that first token then depends on how confident the draft is *after*
    it: a cut that looks ahead keeps the chain when the draft drew a 6 and drops it otherwise, which emits 6 far
    more often than the target would. Mutation check: with the cut made non-causal (``causal = False`` in
    ``Budget.select``) this test fails (p ~ 1e-10)."""
    q = torch.full((8, 8), 1 / 8)
    q[2] = torch.full((8,), 0.5 / 7).index_fill(0, torch.tensor(6), 0.5)  # after the prompt's last token, 2
    q[6] = torch.full((8,), 0.07 / 7).index_fill(0, torch.tensor(4), 0.93)

    class Recording(Budget):
        cuts: list = []

        def select(self, draft):
            plan = super().select(draft)
            self.cuts.append((len(draft), len(plan.draft)))
            return plan

    def make():
        d = BigramDrafter(q)
        d.budget = Recording("auto", Profile([1, 2, 9], [1.0, 1.8, 1.9]))
        return d

    assert two_token_pvalue(make, n=1000, max_new_tokens=6) > 1e-3
    cut = [kept for drafted, kept in Recording.cuts if kept < drafted]
    assert len(Recording.cuts) > 2000 and len(cut) > 500 and sum(k >= 2 for k in cut) > 300  # long chains, cut


def test_a_budget_that_is_no_whole_number_of_tokens_is_one_clear_error():
    """A record or a library caller may hold any JSON number: infinity (JSON's 1e400) and 8.7 are refused with the
    flag's message, not an OverflowError or a silent 8."""
    from specdec_cli.config import BudgetSpec
    from specdec_cli.errors import SpecdecError

    for bad in (float("inf"), float("nan"), 8.7):
        with pytest.raises(SpecdecError, match="--budget must be"):
            BudgetSpec.parse(bad)
    assert BudgetSpec.parse(8.0).limit == 8


def test_a_partial_file_whose_schema_is_not_a_string_is_no_partial_run():
    from specdec_cli.bench.checkpoint import current_schema

    assert current_schema({"schema": [1]}) is None and current_schema({"schema": {"a": 1}}) is None
