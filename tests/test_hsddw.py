"""self-verify and hsddw: greedy identity with ar on SmolLM2, the tau update rule on a hand-worked example, and
exact sampling on a tiny random model."""

from __future__ import annotations

import math

import pytest
import torch
from scipy.stats import chisquare

from specdec_cli import api
from specdec_cli.engine.loop import Outcome, generate
from specdec_cli.drafting.draft_model import DraftModel
from specdec_cli.methods.hsddw import Hsddw
from specdec_cli.methods.self_verify import EntropyThreshold, SelfVerify, window_summary
from specdec_cli.io.models import LoadedModel
from specdec_cli.engine.sampling import SamplingConfig, logits_to_probs

from conftest import CHAT_PROMPTS, tiny_llama

NEW_TOKENS = 40


# --- greedy identity on the real model -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real(smollm2, smollm2_int8):
    """Target, M1 = int8 copy, M2 = bf16 copy, and ar's greedy outputs for two prompts."""
    from specdec_cli.io.models import load_draft

    bf16 = load_draft("bf16:", smollm2)
    expected = []
    for text in CHAT_PROMPTS[:2]:
        ids = api.encode_prompt(smollm2, text, max_new_tokens=NEW_TOKENS)
        expected.append((ids, api.run(smollm2, ids, api.make_drafter("ar", smollm2), max_new_tokens=NEW_TOKENS).tokens))
    return smollm2, smollm2_int8, bf16, expected


@pytest.mark.slow
@pytest.mark.parametrize("method,opts", [("self-verify", {}), ("self-verify", {"tau0": "0"}),
                                         ("hsddw", {}), ("hsddw", {"tau0": "0", "max_draft": "6"})])
def test_greedy_matches_ar(real, method, opts):
    target, int8, bf16, expected = real
    drafts = [int8] if method == "self-verify" else [int8, bf16]
    drafter = api.make_drafter(method, target, drafts, options=opts, budget="paper")
    for ids, tokens in expected:
        result = api.run(target, ids, drafter, max_new_tokens=NEW_TOKENS)
        assert result.tokens == tokens
        s = result.summary()
        assert len(s["window_sizes"]) == s["target_forwards"]
        assert sum(s["window_sizes"]) == s["drafted"]
        assert max(s["window_sizes"]) <= (10 if method == "self-verify" else int(opts.get("max_draft", 20)))
        if method == "hsddw":
            assert s["m2_chain_tokens"] == s["drafted"] and s["m2_accepted_by_target"] == s["accepted"]
            assert s["m1_accepted_by_m2"] <= s["m1_drafted"]
            assert s["eta_target"] == pytest.approx(s["target_utilisation_eta"])


# --- the tau update rule ---------------------------------------------------------------------------------------

LN2, LN3, LN4 = math.log(2), math.log(3), math.log(4)


def row(h: float) -> torch.Tensor:
    """Draft logits over 4 tokens whose softmax entropy is 0, ln2, ln3 or ln4 (uniform over 1..4 tokens)."""
    width = {0.0: 1, LN2: 2, LN3: 3, LN4: 4}[h]
    return torch.tensor([0.0] * width + [-math.inf] * (4 - width))


class ScriptedDraft:
    """A DraftModel stand-in: each ``logits_after`` starts the next scripted step, ``step`` yields its next row."""

    def __init__(self, steps: list[list[float]]):
        self.steps = iter(steps)

    def reset(self):
        pass

    def prefill(self, prompt, now=True):
        pass

    def logits_after(self, tokens):
        self.rows = iter(next(self.steps))
        return row(next(self.rows))

    def step(self, token):
        return row(next(self.rows))


def run_script(drafter, steps_and_paths, cfg=SamplingConfig()):
    drafter.start([0], cfg, None)
    windows, taus = [], []
    for _, path in steps_and_paths:
        draft = drafter.propose([0], 100)
        windows.append(len(draft))
        drafter.accept([0], Outcome(draft, path, [draft.tokens[i] for i in path], 0))
        taus.append(drafter.tau.value)
    return windows, taus


def test_tau_update_hand_worked_paper_cold_start():
    """tau0 = 0 (paper): stop when H > tau; tau = mean entropy of the rejected tokens (draft[len(path)])."""
    script = [
        ([LN3], []),  # tau 0: stops after 1 token; it is rejected -> tau = ln3
        ([0.0, LN2, LN4, 0.0], [0, 1]),  # ln4 > ln3 stops at 3 tokens; token 2 (ln4) rejected -> (ln3+ln4)/2
        ([LN2, LN4, 0.0], [0, 1]),  # ln4 > 1.2425 stops at 2; all accepted -> tau unchanged
        ([0.0, 0.0, 0.0, 0.0], [0]),  # capped at K = 3; token 1 (entropy 0) rejected -> (ln3+ln4+0)/3
    ]
    drafter = SelfVerify(ScriptedDraft([s for s, _ in script]), window=3, tau0=0.0)
    windows, taus = run_script(drafter, script)
    assert windows == [1, 3, 2, 3]
    assert taus == pytest.approx([LN3, (LN3 + LN4) / 2, (LN3 + LN4) / 2, (LN3 + LN4) / 3])
    assert drafter.stats()["window_summary"]["histogram"] == {"1": 1, "2": 1, "3": 2}


def test_tau_default_cold_start_drafts_full_window_until_a_rejection():
    script = [
        ([LN4, LN4, LN4], [0, 1, 2]),  # tau = inf: full window K = 3, all accepted -> still inf
        ([0.0, LN3, LN3], [0]),  # full window again; token 1 (ln3) rejected -> tau = ln3
        ([LN2, LN4, 0.0], []),  # ln4 > ln3 stops at 2; token 0 (ln2) rejected -> (ln3+ln2)/2
    ]
    drafter = SelfVerify(ScriptedDraft([s for s, _ in script]), window=3)
    windows, taus = run_script(drafter, script)
    assert windows == [3, 3, 2]
    assert taus[0] == math.inf and taus[1] == pytest.approx(LN3) and taus[2] == pytest.approx((LN3 + LN2) / 2)
    assert drafter.stats()["tau"] == pytest.approx((LN3 + LN2) / 2)


def test_threshold_and_window_summary_helpers():
    t = EntropyThreshold(2.5)
    assert t.value == 2.5
    t.reject(1.0)
    t.reject(2.0)
    assert t.value == 1.5
    assert window_summary([]) == {"steps": 0, "mean": None, "min": None, "max": None, "histogram": {}}
    assert window_summary([2, 2, 5])["mean"] == 3


# --- exact sampling on a tiny random model ---------------------------------------------------------------------


def tiny_dm(seed: int) -> DraftModel:
    return DraftModel(LoadedModel(tiny_llama(seed=seed), None, f"tiny-{seed}", False), 8)


def exact_two_token_distribution(model, prompt, cfg):
    def next_probs(seq):
        with torch.no_grad():
            return logits_to_probs(model(input_ids=torch.tensor([seq])).logits[0, -1], cfg)

    p1 = next_probs(prompt)
    return torch.stack([p1[a] * next_probs(prompt + [a]) for a in range(8)]).flatten()


def one_thread(items):
    """Iterate with torch on one thread: tiny models only lose to thread start-up and contention on a busy CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield from items
    finally:
        torch.set_num_threads(threads)


def test_hsddw_sampling_preserves_target_distribution():
    """First two sampled tokens of hsddw (tau0 mid-range so both levels stop early and learn) follow p_target."""
    target = tiny_llama(seed=0)
    cfg = SamplingConfig(temperature=1.0)
    prompt = [1, 4, 2]
    expected = exact_two_token_distribution(target, prompt, cfg)
    drafter = Hsddw(tiny_dm(1), tiny_dm(2), window=2, max_draft=3, tau1_0=1.0, tau2_0=1.0)
    n = 1500
    counts = torch.zeros(64)
    rounds = 0
    for seed in one_thread(range(n)):
        res = generate(target, prompt, drafter, max_new_tokens=4, sampling=cfg, seed=seed)
        counts[res.tokens[0] * 8 + res.tokens[1]] += 1
        rounds += res.extra["m2_forwards"]
    assert rounds > n  # several pre-verify rounds happened per generation
    keep = expected * n >= 5
    obs = torch.cat([counts[keep], counts[~keep].sum().view(1)])
    exp = torch.cat([expected[keep] * n, (expected[~keep] * n).sum().view(1)])
    assert chisquare(obs.numpy(), exp.numpy() * obs.sum().item() / exp.sum().item()).pvalue > 1e-3


def test_hsddw_greedy_tiny_matches_ar_and_respects_caps():
    target = tiny_llama(seed=0)
    ar = generate(target, [1, 2, 3], api.Drafter(), max_new_tokens=20).tokens
    drafter = Hsddw(tiny_dm(1), tiny_dm(2), window=3, max_draft=5, tau1_0=0.0, tau2_0=0.0)
    res = generate(target, [1, 2, 3], drafter, max_new_tokens=20)
    assert res.tokens == ar
    s = res.summary()
    assert max(s["window_sizes"]) <= 5 and max(s["m1_window_sizes"]) <= 3
    assert s["m1_drafted"] == sum(s["m1_window_sizes"])
