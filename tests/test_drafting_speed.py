"""Drafting at scale: compiled suffix-array search, array MCTS, output memory, repeated prompt sets,
bench-drafting, multi-corpus builds."""

from __future__ import annotations

import random
import subprocess
import sys

import numpy as np
import pytest

from specdec_cli.datastore import SuffixArrayDatastore, build_suffix_array_datastore
from specdec_cli.drafting.output_memory import OutputMemory
from specdec_cli.drafting.mcts import MCTSConfig, reachable, run_mcts
from specdec_cli.datastore import TrigramMatrix

VOCAB = 50


def brute_longest(docs, context, n_max):
    for n in range(min(n_max, len(context)), 0, -1):
        q = context[-n:]
        if any(doc[i:i + n] == q for doc in docs for i in range(len(doc) - n + 1)):
            return n
    return 0


@pytest.mark.parametrize("vocab", [VOCAB, 70_000])  # 2- and 3-byte tokens
def test_compiled_longest_match_equals_brute_force(tmp_path, vocab):
    rng = random.Random(0)
    docs = [[rng.randrange(6) for _ in range(rng.randrange(5, 60))] for _ in range(30)]
    build_suffix_array_datastore(docs, tmp_path / "sa", fingerprint="x", vocab_size=vocab, shard_bytes=400,
                                 progress=False)  # several shards
    store = SuffixArrayDatastore.load(tmp_path / "sa")
    for _ in range(200):
        context = [rng.randrange(7) for _ in range(rng.randrange(1, 20))]
        n, ranges = store.longest_match(context, 16)
        assert n == brute_longest(docs, context, 16)
        assert (sum(hi - lo for lo, hi in ranges) > 0) == (n > 0)


def tiny_matrix() -> TrigramMatrix:
    docs = [[1, 2, 3, 5], [1, 2, 3, 5], [1, 2, 3], [1, 2, 4, 6], [2, 3, 5, 7], [3, 5, 7, 1]]
    return TrigramMatrix.from_token_docs(docs, 10, top_k=3)


def test_reachable_rows_are_the_matrix_rows():
    m = tiny_matrix()
    m.adjust([2, 4, 9])
    offsets, ids, probs, child_row = reachable(m, 1, 2, depth=3)
    assert list(ids[offsets[0]:offsets[1]]) == m.probs(1, 2)[0]
    for e in range(offsets[1]):  # every root entry points at the row of (2, its token)
        r = child_row[e]
        got = list(ids[offsets[r]:offsets[r + 1]])
        assert got == m.probs(2, int(ids[e]))[0]
        assert np.allclose(probs[offsets[r]:offsets[r + 1]], m.probs(2, int(ids[e]))[1])


def test_array_mcts_is_deterministic_and_scores_rollouts_exactly():
    m = tiny_matrix()
    cfg = MCTSConfig(iterations=60, depth=3, candidates=6)
    a = run_mcts(m, 1, 2, cfg, random.Random(5))
    b = run_mcts(m, 1, 2, cfg, random.Random(5))
    assert a == b and a
    for seq, score in a:  # the score is 1 + the tri-gram probabilities along the rollout
        ctx, total = [1, 2], 1.0
        for tok in seq:
            total += m.prob(ctx[-2], ctx[-1], tok)
            ctx.append(tok)
        assert score == pytest.approx(total)


def test_output_memory_finds_what_was_written():
    mem = OutputMemory(sizes=(4,))
    mem.add([1, 2, 3, 4, 5, 6, 7, 8])
    size, rows = mem.continuations([9, 1, 2, 3, 4], 3)
    assert size == 4 and rows.tolist() == [[5, 6, 7]]
    size, rows = mem.continuations([5, 6, 7, 8], 3)  # nothing after the end of a sequence
    assert size == 0 and rows.size == 0
    assert mem.continuations([0, 0, 0, 0], 3)[0] == 0


def test_repeated_prompt_sets():
    from specdec_cli.io.prompts import load_prompts

    prompts = load_prompts("humaneval*2", limit=2)
    assert [p.id for p in prompts] == ["HumanEval/0#1", "HumanEval/0#2", "HumanEval/1#1", "HumanEval/1#2"]
    assert prompts[0].turns == prompts[1].turns


def test_corpora_join_with_commas():
    from specdec_cli.io.corpora import iter_documents
    from specdec_cli.errors import SpecdecError

    docs = iter_documents("python-stdlib,python-stdlib", limit_docs=3)
    assert len(list(docs)) == 3
    with pytest.raises(SpecdecError):
        list(iter_documents("python-stdlib,no-such-corpus"))


def test_bench_drafting_cli(tmp_path):
    out = subprocess.run([sys.executable, "-m", "specdec_cli.cli", "bench-drafting", "--method", "pld", "--prompts",
                          "long-edit", "--limit", "3", "--steps", "40", "--json"], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    import json

    result = json.loads(out.stdout)
    assert result["method"] == "pld" and result["steps"] > 0 and result["ms_p99"] >= result["ms_median"]
    bad = subprocess.run([sys.executable, "-m", "specdec_cli.cli", "bench-drafting", "--method", "sd"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and bad.stderr.startswith("specdec: error:") and "Traceback" not in bad.stderr
