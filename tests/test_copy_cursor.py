"""Issue 36: the copy cursor (sequential copying at least as good as prompt lookup's choice of occurrence), the
gate on every non-context source of ``auto``, the replay against a known output, the ``wide`` prompt sets and the
guard in ``bench``. No model, no timing."""

from __future__ import annotations

import numpy as np
import pytest

from specdec_cli.bench.guard import NOISE_FLOOR, auto_guard, guard_text
from specdec_cli.bench.replay import make_drafter, oracle_path, replay
from specdec_cli.drafting.gate import Gate
from specdec_cli.drafting.ngram_index import CopyCursor, NgramIndex, best_chain
from specdec_cli.drafting.output_memory import OutputMemory
from specdec_cli.drafting.prompt_lookup import FirstOccurrenceIndex
from specdec_cli.drafting.sources import ContextSource, MemorySource
from specdec_cli.engine.trees import Draft, likeliest_path_first
from specdec_cli.runtime.profile import Profile

# --- a synthetic edit: the answer re-emits the prompt's lines in order, with a token inserted in each ---------------

LINE = list(range(10, 22))  # 12 tokens shared by every line: every tail n-gram (n <= 8) recurs in every line


def synthetic_edit(lines: int = 6, seed: int = 0) -> tuple[list[int], list[int]]:
    """(prompt, answer): ``lines`` lines that differ in one token only, then the same lines re-emitted with a
    token inserted after the one that differs (a type hint after a name)."""
    rng = np.random.default_rng(seed)
    names = rng.choice(np.arange(100, 200), lines, replace=False).tolist()
    body = [t for k in range(lines) for t in LINE[:6] + [names[k]] + LINE[6:] + [1]]
    answer = [t for k in range(lines) for t in LINE[:6] + [names[k], 300 + k] + LINE[6:] + [1]]
    return [2, 3, 4] + body + [5, 6], answer


def trajectory(draft_fn, prompt: list[int], answer: list[int]) -> tuple[int, int]:
    """(steps, accepted tokens) of a chain drafter verified against the known answer, one step at a time."""
    truth, at, steps, accepted = prompt + answer, len(prompt), 0, 0
    while at < len(truth):
        chain = draft_fn(truth[:at])
        k = 0
        while k < len(chain) and at + k < len(truth) and chain[k] == truth[at + k]:
            k += 1
        steps, accepted, at = steps + 1, accepted + k, at + k + 1
    return steps, accepted


def pld_fn(prompt):
    index = FirstOccurrenceIndex(3)
    index.prepare(list(prompt))
    return lambda seq: index.lookup(seq, 10)[0]


def most_recent_fn(prompt):
    """auto's context drafting before issue 36: the continuation of the most recent occurrence of the longest tail."""
    index = NgramIndex(range(1, 9))
    index.extend(list(prompt))

    def draft(seq):
        index.follow(seq)
        _, starts = index.find(seq, 16)
        return index.continuation(starts[0], 10) if starts else []
    return draft


def cursor_fn(prompt):
    index = NgramIndex(range(1, 9))
    index.extend(list(prompt))
    cursor = CopyCursor(index)

    def draft(seq):
        index.follow(seq)
        return best_chain(index, cursor, seq, 10, 16, 8)[0]
    return draft


@pytest.mark.parametrize("seed", range(4))
def test_the_cursor_copies_an_edit_at_least_as_well_as_prompt_lookup(seed):
    prompt, answer = synthetic_edit(seed=seed)
    pld_steps, pld_accepted = trajectory(pld_fn(prompt), prompt, answer)
    steps, accepted = trajectory(cursor_fn(prompt), prompt, answer)
    _, recent_accepted = trajectory(most_recent_fn(prompt), prompt, answer)
    assert accepted >= pld_accepted and steps <= pld_steps
    assert accepted > recent_accepted  # the most recent occurrence is the previous line: the wrong name


def test_the_cursor_follows_the_copy_and_finds_it_again_after_an_insertion():
    prompt, answer = synthetic_edit(lines=3)
    index = NgramIndex(range(1, 9))
    index.extend(prompt)
    cursor = CopyCursor(index)
    first = len(prompt) - 2 - 2 * (len(LINE) + 2)  # where the prompt's second line starts
    seq = prompt + answer[: len(LINE) + 3 + 6]  # the first line, then the second line up to its name
    index.follow(seq)
    starts, _, _, _ = cursor.candidates(seq, 16, 8)
    seq += [prompt[first + 6], 301]  # the target writes the name (a copy), then inserts a token
    index.follow(seq)
    starts, _, _, run = cursor.candidates(seq, 16, 8)
    assert cursor.pos < 0 and cursor.anchor == first + 7  # the copy was left right after the name
    seq += [prompt[first + 7]]  # ... and goes on copying
    index.follow(seq)
    starts, _, _, run = cursor.candidates(seq, 16, 8)
    assert starts[0] == first + 8 and run == 1  # found again one token after the place it was left


def test_best_chain_scores_every_token():
    prompt, answer = synthetic_edit(lines=40)
    index = NgramIndex(range(1, 9))
    seq = prompt + answer[:7]  # the first line up to its name: found once, in the prompt
    index.extend(seq)
    cursor = CopyCursor(index)
    chain, scores = best_chain(index, cursor, seq, 6, 16, 8)
    assert chain == LINE[6:] and len(scores) == 6 and all(0 < s <= 1 for s in scores)
    assert best_chain(NgramIndex(), CopyCursor(NgramIndex()), [1, 2], 4, 16, 8) == ([], [])


def test_context_source_proposes_the_cursor_chain_in_its_own_buckets():
    prompt, answer = synthetic_edit(lines=4)
    source = ContextSource(max_n=8)
    source.start(prompt)
    seq = prompt + answer[:20]
    for cut in range(len(prompt) + 1, len(seq) + 1):  # one token per step, as a run of ar steps
        drafts = source.propose(seq[:cut], 8)
    buckets = [bucket for _, bucket in drafts]
    assert buckets[0] >= 6 and all(isinstance(d, Draft) for d, _ in drafts)


# --- gates: every source but the context ------------------------------------------------------------------------


def test_every_source_but_the_context_has_a_gate():
    from specdec_cli.methods.auto import AutoDrafter

    drafter = AutoDrafter([ContextSource(), MemorySource(OutputMemory())])
    assert set(drafter.gates) == {"memory"}


def test_a_losing_cheap_source_is_gated_and_gets_a_fresh_chance_next_generation():
    gate = Gate()
    for _ in range(8):
        gate.record(0, 0.002, 60.0)  # verification of nodes nobody else proposed, never accepted
    assert not gate.open() and gate.gated == 1
    gate.start()  # lost a little: the next prompt may be the one it knows
    assert gate.open() and gate.backoff == 1
    for _ in range(8):
        gate.record(0, 0.05, 60.0)  # three tokens' worth lost per step: stays off
    gate.start()
    assert gate.skip > 0 and not gate.open()
    gate.skip = 3000  # a long gated stretch from earlier prompts: a new prompt still probes it within 8 steps
    gate.start()
    assert 0 < gate.skip <= 8 and gate.backoff > 1
    model_gate = Gate(cheap_probe=False)  # auto's draft-model gate: a probe first prefills the draft model
    model_gate.net, model_gate.skip = -3.0, 3000
    model_gate.start()
    assert model_gate.skip == 3000


def test_auto_gates_a_memory_that_does_not_pay_in_a_replay():
    """A memory of unrelated outputs: its nodes are verified and rejected until its gate closes."""
    rng = np.random.default_rng(0)
    profile = Profile([1, 2, 4, 8, 16], [0.03, 0.033, 0.045, 0.08, 0.12])
    drafter = make_drafter("auto", profile, 500)
    prompt, answer = synthetic_edit(lines=3)
    for _ in range(3):  # earlier outputs share short n-grams with the answer but continue otherwise
        noise = rng.integers(10, 30, 200).tolist()
        replay(drafter, noise[:20], noise[20:], 128)
    res = replay(drafter, prompt, answer, 128)
    assert res.sources["memory"]["gated_steps"] > 0 and "gated_steps" not in res.sources["context"] or \
        res.sources["context"]["gated_steps"] == 0


# --- the replay -----------------------------------------------------------------------------------------------------


def test_replay_counts_are_those_of_the_known_output():
    prompt, answer = synthetic_edit(lines=3)
    profile = Profile([1, 2, 4, 8, 16], [0.03, 0.033, 0.045, 0.08, 0.12])
    for method in ("ar", "pld", "auto", "ngram-trie"):
        res = replay(make_drafter(method, profile, 500), prompt, answer, len(answer))
        assert res.new_tokens == len(answer) and res.emitted == len(answer)
        assert res.forwards == len(answer) - res.accepted
    again = replay(make_drafter("auto", profile, 500), prompt, answer, len(answer))
    assert again.steps == replay(make_drafter("auto", profile, 500), prompt, answer, len(answer)).steps


def test_oracle_path_and_likeliest_path_first():
    draft = Draft([5, 7, 6, 8], [-1, -1, 0, 2])
    assert oracle_path(draft, [1, 5, 6, 8, 9], 1) == [0, 2, 3]
    ordered = likeliest_path_first(Draft([5, 7, 6, 8], [-1, -1, 0, 2]), np.array([0.4, 0.5, 0.3, 0.2]))
    assert ordered.tokens == [7, 5, 6, 8] and ordered.parents == [-1, -1, 1, 2]


# --- the guard --------------------------------------------------------------------------------------------------


def result(method, tps, per_prompt_tps, sources=None):
    per = [{"prompt_id": f"p{i}", "turn": 0, "new_tokens": 100, "seconds": 100 / t} for i, t in enumerate(per_prompt_tps)]
    out = {"method": method, "tokens_per_s": tps, "speedup": tps / 10, "mean_accepted_length": 2.0, "per_prompt": per}
    if sources:
        out["sources"] = sources
    return out


def test_the_guard_flags_auto_below_the_best_method_by_more_than_noise():
    sources = {"context": {"verified": 900, "accepted": 300, "accepted_only": 290, "gated_steps": 0},
               "memory": {"verified": 200, "accepted": 20, "accepted_only": 5, "gated_steps": 40}}
    trailing = auto_guard([result("ar", 10, [10] * 6), result("auto", 12, [12, 11.9, 12.1, 12, 11.8, 12.2], sources),
                           result("pld", 14, [14, 13.9, 14.1, 14, 14.2, 13.8])])
    assert trailing["best"] == "pld" and trailing["trails"] and trailing["ratio"] == pytest.approx(12 / 14)
    text = guard_text(trailing)
    assert "TRAILS pld" in text and "memory 20/200 (alone 5, gated 40)" in text
    noisy = auto_guard([result("auto", 13.6, [10, 17, 12, 16]), result("pld", 14, [14, 14, 14, 14])])
    assert not noisy["trails"] and noisy["noise"] > 0.03  # 3% below, well inside this run's noise
    ahead = auto_guard([result("auto", 15, [15, 15]), result("ngram-trie", 14, [14, 14])])
    assert not ahead["trails"] and ahead["noise"] == NOISE_FLOOR
    assert auto_guard([result("ar", 10, [10]), result("pld", 12, [12])]) is None


# --- the wide prompt sets ---------------------------------------------------------------------------------------


def test_the_wide_sets_load_offline_and_the_held_out_split_is_disjoint():
    from specdec_cli.io.prompts import load_prompts

    tune, held = load_prompts("wide"), load_prompts("wide-heldout")
    assert len(tune) >= 25 and len(held) >= 15
    assert not {p.id for p in tune} & {p.id for p in held}
    assert not {p.turns[0] for p in tune} & {p.turns[0] for p in held}
    kinds = {"hints", "rename", "docstring", "refactor", "chat"}
    assert {p.category for p in tune} == kinds == {p.category for p in held}
    assert [p.category for p in tune[:5]] == ["hints", "rename", "docstring", "refactor", "chat"]  # interleaved
    assert all(not p.raw and len(p.turns) == 1 for p in tune + held)
    assert len(load_prompts("wide", category="chat")) >= 5
