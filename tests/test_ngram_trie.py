"""N-Gram-Trie: the paper's construction (n = 6, L_p = 3) by hand, matching, pruning, greedy identity with ``ar``."""

from __future__ import annotations

import textwrap

import pytest

from specdec_cli.methods.ngram_trie import TrieNode, build_trie, match, prune, sample_windows


def as_dict(node: TrieNode) -> dict:
    """``{token: (frequency, subtree)}`` for comparing whole tries."""
    return {t: (c.freq, as_dict(c)) for t, c in node.children.items()}


def test_windows_n6_lp3():
    d = sample_windows([1, 2, 3, 4, 5, 6, 7], n=6, lp=3)
    assert d == {((1, 2, 3), (4, 5, 6)): 1, ((2, 3, 4), (5, 6, 7)): 1, ((3, 4, 5), (6, 7)): 1,
                 ((4, 5, 6), (7,)): 1}


def test_trie_construction_figure1_setting():
    # n = 6, L_p = 3 over "a b c a b d" (a=1, b=2, c=3, d=4). Windows: <abc, abd>, <bca, bd>, <cab, d>.
    # Sub-prefixes j = 0, 1, 2 of each are inserted from the root:
    #   abcabd, bcabd, cabd | bcabd, cabd, abd | cabd, abd, bd
    root = build_trie([1, 2, 3, 1, 2, 4], n=6, lp=3)
    a, b, c, d = 1, 2, 3, 4
    expected = {
        a: (3, {b: (3, {c: (1, {a: (1, {b: (1, {d: (1, {})})})}), d: (2, {})})}),
        b: (3, {c: (2, {a: (2, {b: (2, {d: (2, {})})})}), d: (1, {})}),
        c: (3, {a: (3, {b: (3, {d: (3, {})})})}),
    }
    assert as_dict(root) == expected


def test_repeated_windows_count_as_frequency():
    root = build_trie([5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7, 9], n=4, lp=2)
    node, k = match(root, [0, 5, 6, 7], lp=2)  # last 2 tokens "6 7" are a path with continuations
    assert k == 2
    assert {t: c.freq for t, c in node.children.items()} == {8: 4, 9: 2}


def test_match_falls_back_to_shorter_prefixes():
    root = build_trie([1, 2, 3, 1, 2, 4], n=6, lp=3)
    assert match(root, [9, 9, 1], lp=3)[1] == 1
    assert match(root, [9, 1, 2], lp=3)[1] == 2
    assert match(root, [9, 9, 9], lp=3) == (None, 0)
    assert match(root, [1, 2, 4], lp=3) == (None, 0)  # "a b d" ends the text: no continuation anywhere


def test_prune_keeps_most_frequent_nodes_as_a_tree():
    root = build_trie([1, 2, 3, 1, 2, 4], n=6, lp=3)
    node, _ = match(root, [7, 1], lp=3)  # after "a": b(3) -> d(2), c(1) -> a(1) -> ...
    draft = prune(node, budget=3, max_depth=10)
    assert draft.tokens == [2, 4, 3] and draft.parents == [-1, 0, 0]
    deep = prune(node, budget=10, max_depth=2)
    assert deep.tokens == [2, 4, 3]  # depth-limited
    assert prune(node, budget=10, max_depth=10).tokens == [2, 4, 3, 1, 2, 4]


# ------------------------------------------------------------------------------------- real model, greedy

def model_prompts() -> list[str]:
    """A summarization prompt quoting a real document (lookups hit) and a plain chat prompt."""
    doc = textwrap.dedent(textwrap.__doc__ or "") + textwrap.dedent(textwrap.TextWrapper.__doc__ or "")[:1200]
    return ["Summarize the following document, quoting its key phrases:\n\n" + doc,
            "Write a Python function that checks whether a number is prime."]


@pytest.fixture(scope="module")
def greedy_cases(smollm2):
    from specdec_cli import api

    cases = []
    for text in model_prompts():
        ids = api.encode_prompt(smollm2, text, max_new_tokens=32)
        cases.append((ids, api.run(smollm2, ids, api.make_drafter("ar", smollm2), max_new_tokens=32).tokens))
    return cases


@pytest.mark.parametrize("method", ["ngram-trie", "pld"])
def test_greedy_matches_ar(smollm2, greedy_cases, method):
    from specdec_cli import api

    for ids, expected in greedy_cases:
        result = api.run(smollm2, ids, api.make_drafter(method, smollm2), max_new_tokens=32)
        assert result.tokens == expected


def test_growing_the_trie_equals_rebuilding_it():
    """Adding generated tokens window by window gives the trie of the whole sequence, frequencies included."""
    import random

    from specdec_cli.methods.ngram_trie import grow

    def flat(node, prefix=()):
        out = {}
        for tok, child in node.children.items():
            out[prefix + (tok,)] = child.freq
            out.update(flat(child, prefix + (tok,)))
        return out

    rng = random.Random(0)
    seq = [rng.randrange(6) for _ in range(60)]
    for n, lp in ((6, 3), (13, 3), (4, 2)):
        root = build_trie(seq[:20], n, lp)
        indexed = 20
        for end in (21, 22, 30, 31, 45, 60):
            grow(root, seq[:end], indexed, n, lp)
            indexed = end
            assert flat(root) == flat(build_trie(seq[:end], n, lp)), (n, lp, end)
