"""specdec's drafting for other engines, without them: the chain drafter (one object, many sequences), the rows
to sequences tracker (vLLM's proposer interface has no request ids) and the step-cost model. A fake engine
verifies chains greedily against a known continuation, as vLLM does."""

from __future__ import annotations

import numpy as np
import pytest

from specdec_cli.drafting.ngram_index import NgramIndex
from specdec_cli.drafting.output_memory import OutputMemory
from specdec_cli.drafting.sources import bucket_of
from specdec_cli.serving.chain_sources import BESIDE_CURSOR, REACH, ContextChains, MemoryChains, best_chain, reach, \
    rows_chain
from specdec_cli.serving.chains import ChainDrafter, SeqState, choose, common_prefix
from specdec_cli.serving.chain_sources import Offer
from specdec_cli.serving.pricing import StepCost
from specdec_cli.serving.rows import RowTracker

MAX_LEN = 4096


def brute_chain(rows: np.ndarray) -> list[int]:
    """The most frequent path, by brute force: at each depth the most common token of the rows on the path, the
    earliest row first among ties."""
    alive, out = list(range(len(rows))), []
    for d in range(rows.shape[1]):
        counts: dict[int, int] = {}
        for i in alive:
            if rows[i, d] >= 0:
                counts[int(rows[i, d])] = counts.get(int(rows[i, d]), 0) + 1
        if not counts:
            break
        best = max(counts.values())
        token = next(int(rows[i, d]) for i in alive if rows[i, d] >= 0 and counts[int(rows[i, d])] == best)
        out.append(token)
        alive = [i for i in alive if rows[i, d] == token]
    return out


def test_best_chain_is_the_most_frequent_path():
    rng = np.random.default_rng(0)
    for _ in range(200):
        rows = rng.integers(0, 3, size=(rng.integers(1, 12), rng.integers(1, 6)))
        rows[rng.random(rows.shape) < 0.1] = -1
        for r in rows:  # -1 only after a continuation's end
            end = np.flatnonzero(r < 0)
            if end.size:
                r[end[0]:] = -1
        tokens, shares = rows_chain(rows, 1.0)
        assert tokens == brute_chain(rows)
        assert all(0 < s <= 1 for s in shares)


def test_choose_takes_the_best_prefix_and_merges_agreement():
    a = Offer("context", 3, [1, 2, 3, 4], [0.9] * 4, est=[0.9, 0.9, 0.2, 0.9])
    b = Offer("memory", 3, [1, 2, 5], [0.5] * 3, est=[0.5, 0.95, 0.1])
    chain, by = choose([a, b], threshold=0.3)
    assert chain == [1, 2]  # the third token of either pays less than it costs
    assert by == [("context", "memory"), ("context", "memory")]
    assert choose([a, b], threshold=1.0) == ([], [])  # nothing pays at that price
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2


def test_step_cost_recovers_a_linear_step_time():
    cost = StepCost()
    rng = np.random.default_rng(1)
    for _ in range(400):
        tokens = int(rng.integers(1, 17))
        cost.observe(tokens, 0.020 + 0.002 * tokens, emitted=2)
    assert cost.per_token == pytest.approx(0.002, rel=0.05)
    assert cost.threshold == pytest.approx(cost.value * cost.per_token)


class FakeEngine:
    """vLLM's side of the interface: rows of token ids, each row's newly sampled tokens, greedy verification of
    the drafted chains against each request's known answer; rows condense when a request finishes."""

    def __init__(self, tracker: RowTracker, rows: int = 8):
        self.tracker, self.buf = tracker, np.zeros((rows, MAX_LEN), dtype=np.int32)
        self.active: list[dict] = []
        self.forwards = 0

    def add(self, prompt: list[int], answer: list[int]) -> None:
        self.active.append({"seq": list(prompt), "answer": list(answer), "done": 0, "sampled": [], "draft": []})

    def step(self) -> None:
        for req in self.active:  # verify last step's draft (a new request: its prefill samples one token)
            if not req["sampled"] and not req["done"]:
                new = [req["answer"][0]]
            else:
                todo = req["answer"][req["done"]:]
                acc = common_prefix(req["draft"], todo[:-1] if len(todo) > 1 else [])
                new = todo[: acc + 1]
            req["seq"] += new
            req["done"] += len(new)
            req["sampled"] = new
        self.forwards += 1
        for i, req in enumerate(self.active):
            self.buf[i, : len(req["seq"])] = req["seq"]
        drafts = self.tracker.propose([r["sampled"] for r in self.active],
                                      np.array([len(r["seq"]) for r in self.active]), self.buf)
        for req, draft in zip(self.active, drafts):
            req["draft"] = draft
            assert all(isinstance(t, int) for t in draft)
        finished = [r for r in self.active if r["done"] >= len(r["answer"])]
        for req in finished:  # vLLM condenses: the last row moves into the freed one
            i = self.active.index(req)
            self.active[i] = self.active[-1]
            self.active.pop()

    def run(self) -> None:
        while self.active:
            self.step()
        self.tracker.propose([], np.zeros(0, dtype=np.int64), self.buf)  # an idle call: everyone left


def copying_task(seed: int, length: int = 60) -> tuple[list[int], list[int]]:
    """A prompt, and an answer that copies most of it in order (an edit), with a few changed tokens."""
    rng = np.random.default_rng(seed)
    body = rng.integers(100, 400, size=length).tolist()
    answer = [t if rng.random() > 0.05 else int(rng.integers(400, 500)) for t in body]
    return [1, 2, 3] + body + [4], answer


def make() -> tuple[ChainDrafter, RowTracker]:
    memory = OutputMemory(100_000)
    drafter = ChainDrafter([ContextChains(), MemoryChains(memory)], memory)
    return drafter, RowTracker(drafter, max_draft=8, max_model_len=MAX_LEN)


def test_many_sequences_are_tracked_through_row_moves_and_copied():
    drafter, tracker = make()
    engine = FakeEngine(tracker)
    tasks = [copying_task(s) for s in range(6)]
    for prompt, answer in tasks:
        engine.add(prompt, answer)
    engine.run()
    stats = drafter.stats()
    assert stats["sequences_begun"] == 6 and stats["sequences_ended"] == 6  # no row was taken for a new request
    assert not tracker.live and not drafter.seqs
    emitted = sum(len(a) for _, a in tasks)
    assert engine.forwards < emitted / 2  # copying pays: over two tokens a step
    assert stats["sources"]["context"]["accepted"] > 0
    assert stats["accepted"] <= stats["verified"]


def test_identical_requests_in_two_rows_stay_two_sequences():
    drafter, tracker = make()
    engine = FakeEngine(tracker)
    prompt, answer = copying_task(7)
    engine.add(prompt, answer)
    engine.add(prompt, answer)
    engine.run()
    assert drafter.stats()["sequences_begun"] == 2


def test_a_second_pass_drafts_from_the_memory_of_the_first():
    drafter, tracker = make()
    rng = np.random.default_rng(3)
    prompt, answer = [1] + rng.integers(100, 400, size=40).tolist(), rng.integers(500, 900, size=50).tolist()
    first = FakeEngine(tracker)
    first.add(prompt, answer)
    first.run()
    before = drafter.stats(reset=True)
    assert before["sources"].get("memory", {}).get("accepted", 0) == 0  # nothing to remember yet
    second = FakeEngine(tracker)
    second.add(prompt, answer)
    second.run()
    after = drafter.stats()
    assert after["sources"]["memory"]["accepted"] > 30  # the first pass's answer, drafted back
    assert second.forwards < first.forwards / 3


@pytest.mark.parametrize("back", [True, False])
def test_the_proposer_forgets_what_a_warm_up_taught(monkeypatch, back):
    """bench's warm-up decodes the start of a timed prompt: without ``back_to_mark`` the proposer's memory drafts
    that answer back to the timed run (the vLLM side of the bench warm-up fix)."""
    from types import SimpleNamespace

    from specdec_cli.serving import ENV
    from specdec_cli.serving.proposer import SpecdecProposer

    monkeypatch.delenv(ENV, raising=False)  # defaults: context and memory on
    config = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=8),
                             model_config=SimpleNamespace(get_vocab_size=lambda: 1000, max_model_len=MAX_LEN))
    proposer = SpecdecProposer(config)
    rng = np.random.default_rng(3)
    prompt, answer = [1] + rng.integers(100, 400, size=40).tolist(), rng.integers(500, 900, size=50).tolist()
    proposer.mark()
    warm = FakeEngine(proposer.rows)
    warm.add(prompt, answer)
    warm.run()
    if back:
        proposer.back_to_mark()
    proposer.drafter.stats(reset=True)
    timed = FakeEngine(proposer.rows)
    timed.add(prompt, answer)
    timed.run()
    recalled = proposer.drafter.stats()["sources"].get("memory", {}).get("accepted", 0)
    assert recalled == 0 if back else recalled > 30


def test_rows_still_prefilling_and_long_sequences_get_no_draft():
    drafter = ChainDrafter([ContextChains()])
    tracker = RowTracker(drafter, max_draft=8, max_model_len=12)
    buf = np.zeros((2, 12), dtype=np.int32)
    buf[0, :11] = [5, 6, 7, 5, 6, 7, 5, 6, 7, 5, 6]
    out = tracker.propose([[], [6]], np.array([0, 11]), buf[[1, 0]])
    assert out == [[], []]  # a prefilling row; a row one token from the model's length
    buf[1, :6] = [5, 6, 7, 5, 6, 7]
    assert len(tracker.propose([[7]], np.array([6]), buf[[1]])[0]) <= 12 - 1 - 6


def test_engine_vllm_without_vllm_installed_is_one_line():
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys; sys.modules['vllm'] = None; sys.argv = ['specdec', 'generate', '--engine', 'vllm', 'hi']; "
            "from specdec_cli.cli import main; main()")
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=root,
                          env={**os.environ, "PYTHONPATH": str(root)})
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specdec: error: --engine vllm needs vLLM"), proc.stderr


class FixedCost(StepCost):
    """A step price that does not depend on the clock: a draft token pays above a 0.1 chance of acceptance."""

    threshold, per_token, value = 0.1, 1e-3, 100.0

    def observe(self, tokens: int, seconds: float, emitted: int) -> None:
        pass


@pytest.mark.parametrize("seed", range(3))
def test_the_context_chain_follows_a_copied_edit_with_the_cursor(seed):
    """An edit re-emits the prompt's lines with a token inserted in each (tests/test_copy_cursor.py): the most
    recent occurrence of the tail is the wrong line, the copy cursor the right one. The proposer drafts from the
    cursor (its calibration buckets) and needs no more steps than prompt lookup's choice of occurrence."""
    from test_copy_cursor import pld_fn, synthetic_edit, trajectory

    prompt, answer = synthetic_edit(seed=seed)
    drafter = ChainDrafter([ContextChains()], None)
    drafter.cost = FixedCost()  # the fake engine's step times are the proposer's own: noise, not a price
    engine = FakeEngine(RowTracker(drafter, max_draft=10, max_model_len=MAX_LEN), rows=1)
    engine.add(prompt, answer)
    engine.run()
    pld_steps, _ = trajectory(pld_fn(prompt), prompt, answer)
    assert any(source == "context" and bucket >= 6 for source, bucket in drafter.calibration.cells)
    assert engine.forwards <= pld_steps


def test_the_context_offers_the_cursors_copy_and_the_other_occurrences_beside_it():
    """While the cursor copies one occurrence, the context also offers the other occurrences of the tail (in
    calibration buckets of their own), so a copy that goes wrong (a completion that leaves the prompt's text) does
    not hide the occurrence that goes on; the drafter calibrates both and sends one."""

    # "7 8 9 1 2 3" twice, followed by 4 and by 5; the sequence ends in "7 8"
    prompt = [20, 7, 8, 9, 1, 2, 3, 4, 21, 7, 8, 9, 1, 2, 3, 5, 22, 7, 8]
    index = NgramIndex(range(1, 9), max_positions=16)
    index.extend(prompt)
    seq, source = SeqState(index, len(prompt)), ContextChains()
    first = source.offers(seq, index.tokens, 6)
    # not copying yet; a 2-token match reaches 4 tokens (REACH = 2 tokens a token of evidence)
    assert [(o.bucket, o.tokens) for o in first] == [(bucket_of(2), [9, 1, 2, 3])]
    index.extend([9, 1, 2])  # the engine accepted the most recent occurrence's first tokens: the cursor copies it
    cursor, other = source.offers(seq, index.tokens, 6)
    assert cursor.bucket >= 6 and cursor.tokens == [3, 5, 22, 7, 8, 9]
    assert other.bucket == bucket_of(5) + BESIDE_CURSOR and other.tokens == [3, 4, 21, 7, 8, 9]
    # the drafter calibrates both, sends one, and counts its source once where the two chains agree
    drafter = ChainDrafter([ContextChains()])
    drafter.begin(0, prompt)
    drafter.draft([0], [6])
    drafter.advance(0, [9, 1, 2])
    (chain,) = drafter.draft([0], [6])
    assert chain and chain[0] == 3
    assert all(names == ("context",) for names in drafter.seqs[0].sent_by)


def test_a_matched_chain_reaches_as_far_as_its_evidence():
    """SuffixDecoding's spec factor: a chain after an n-token tail match goes at most REACH * n tokens (the
    context's and the memory's); the cursor's copy of the occurrence it located goes as far as asked."""
    assert reach(16, 1) == int(REACH) and reach(16, 0) == 1 and reach(3, 100) == 3
    body = list(range(100, 140))
    prompt = [1, 2, *body, 3, 1, 2]  # the tail "1 2" matched 2 tokens: the 40 tokens after it are offered 4 deep
    index = NgramIndex(range(1, 9), max_positions=16)
    index.extend(prompt)
    seq, source = SeqState(index, len(prompt)), ContextChains()
    (offer,) = source.offers(seq, index.tokens, 16)
    assert offer.tokens == body[: reach(16, 2)]
    index.extend(body[:4])  # accepted: the cursor copies that occurrence now
    offer = source.offers(seq, index.tokens, 16)[0]
    assert offer.bucket >= 6 and offer.tokens == body[4: 20]
    memory = OutputMemory(10_000)
    memory.remember([7], [5, 6, *body])
    (chain,) = [o.tokens for o in MemoryChains(memory).offers(seq, [9, 5, 6], 16)]
    assert chain == body[: reach(16, 2)]
