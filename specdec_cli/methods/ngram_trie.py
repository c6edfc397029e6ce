"""``ngram-trie``: N-Gram-Trie speculative decoding for in-context tasks (summaries, RAG, context QA).

Construction (paper Sec. 3.1, Algorithm 1): a sliding window of ``n`` tokens moves over the prompt; each
window splits into a prefix ``P_i`` (its first ``L_p`` tokens) and a suffix ``S_i`` (the rest). The samples
``<P_i, S_i, f>`` (``f`` = how often that pair occurs) are inserted into a trie once per sub-prefix
``P_i[j:] + S_i`` for ``j in 0..L_p-1``; every node on an inserted path gains ``f``, so a node's frequency
counts the windows that pass through it (and never exceeds its parent's).

Drafting (Sec. 3.2): match the last ``L_p`` generated tokens from the root, dropping one token at a time until
a match with a continuation is found; the matched node's subtree is the suffix tree. It is pruned to the
``budget`` most frequent nodes (the paper's min-heap; ancestors always outrank descendants, so the kept set is
a tree) and verified with tree attention.

Beyond the paper, the verified output is added to the trie as it is generated (``grow``, default on; off with
``--budget paper`` or ``--opt grow=0``), so the drafter also copies from what it wrote, as prompt lookup does;
and a match shorter than ``L_p`` tokens halves its nodes' scores per missing token (a weaker bet for the budget).

Options (n, lp, budget, max_depth, grow) and their defaults: the registry ``specdec_cli.methods.METHODS``
(``specdec methods``); ``--window`` sets the deepest draft node too.
"""

from __future__ import annotations

import time
from collections import Counter

from ..engine.loop import Draft, Drafter
from ..engine.trees import best_first


class TrieNode:
    __slots__ = ("children", "freq")

    def __init__(self, freq: int = 0):
        self.children: dict[int, TrieNode] = {}
        self.freq = freq


def sample_windows(tokens: list[int], n: int, lp: int) -> Counter:
    """Eqs. 1-2: the dependency set D as a Counter of ``(prefix, suffix) -> f``.

    Windows start at every position whose prefix is complete and leaves at least one suffix token; the last
    windows' suffixes are cut at the end of the text.
    """
    return Counter((tuple(tokens[i:i + lp]), tuple(tokens[i + lp:i + n])) for i in range(len(tokens) - lp))


def insert(root: TrieNode, key, f: int) -> None:
    """Eq. 4: share the node of an existing token, else create one; every node on the path gains ``f``."""
    node = root
    for t in key:
        child = node.children.get(t)
        if child is None:
            child = node.children[t] = TrieNode(0)
        child.freq += f
        node = child


def build_trie(tokens: list[int], n: int = 13, lp: int = 3) -> TrieNode:
    """Algorithm 1: insert every sub-prefix ``P_i[j:] + S_i`` (``j = 0..L_p-1``) of every sample."""
    root = TrieNode()
    for (prefix, suffix), f in sample_windows(tokens, n, lp).items():
        for j in range(lp):
            insert(root, prefix[j:] + suffix, f)
    return root


def extend(root: TrieNode, key, known: int, f: int = 1) -> None:
    """Insert ``key`` whose first ``known`` tokens were inserted before (walked, not counted again)."""
    node = root
    for depth, t in enumerate(key):
        child = node.children.get(t)
        if child is None:
            child = node.children[t] = TrieNode(0)
        if depth >= known:
            child.freq += f
        node = child


def grow(root: TrieNode, tokens: list[int], indexed: int, n: int, lp: int) -> None:
    """Add the windows of ``tokens`` that reach beyond its first ``indexed`` tokens (already in the trie): new
    windows whole, and windows whose suffix was cut at ``indexed`` by the part that is new. Afterwards the trie
    is the one :func:`build_trie` makes of ``tokens`` (same frequencies), at the cost of the new windows only."""
    for i in range(max(indexed - n + 1, 0), len(tokens) - lp):
        had = min(n - lp, indexed - i - lp) if i < indexed - lp else 0  # suffix tokens inserted (0: none)
        want = min(n - lp, len(tokens) - i - lp)
        if want <= had:
            continue
        for j in range(lp):
            key = tokens[i + j: i + lp + want]
            extend(root, key, (lp - j + had) if had else 0)


def match(root: TrieNode, tokens: list[int], lp: int) -> tuple[TrieNode | None, int]:
    """Longest suffix of ``tokens`` (at most ``L_p``) that is a path from the root with a continuation."""
    for k in range(min(lp, len(tokens)), 0, -1):
        node = root
        for t in tokens[-k:]:
            node = node.children.get(t)
            if node is None:
                break
        if node is not None and node.children:
            return node, k
    return None, 0


def prune(node: TrieNode, budget: int, max_depth: int) -> Draft:
    """The ``budget`` most frequent nodes of ``node``'s subtree (depth <= ``max_depth``) as a draft tree (the
    paper's min-heap pruning; ``trees.best_first``), each scored by its frequency over its parent's."""
    return best_first(node, budget, max_depth)


class NGramTrie(Drafter):
    name = "ngram-trie"

    def __init__(self, n: int = 13, lp: int = 3, budget: int = 32, max_depth: int | None = None,
                 grow_output: bool = True):
        self.n, self.lp, self.max_nodes = n, lp, budget  # the paper's node budget (before the engine's selection)
        self.max_depth = max_depth or n - 1
        self.grow_output = grow_output
        self.root = TrieNode()

    def start(self, prompt, cfg, generator) -> None:
        super().start(prompt, cfg, generator)
        t0 = time.perf_counter()
        self.root = build_trie(list(prompt), self.n, self.lp)
        self.indexed = len(prompt)
        self.build_s = time.perf_counter() - t0
        self.matched = Counter()

    def propose(self, tokens: list[int], max_tokens: int) -> Draft:
        node, k = match(self.root, tokens, self.lp)
        self.matched[k] += 1
        if node is None or max_tokens < 1:
            return Draft()
        draft = prune(node, self.max_nodes, min(self.max_depth, max_tokens))
        if k < self.lp and draft.scores:  # a shorter context match is a weaker bet
            draft.scores = [p * 0.5 ** (self.lp - k) for p in draft.scores]
        return draft

    def accept(self, tokens: list[int], outcome) -> None:
        """With ``grow_output``, the verified output joins the trie too (as prompt lookup looks at prompt + output)."""
        if self.grow_output:
            grow(self.root, tokens, self.indexed, self.n, self.lp)
            self.indexed = len(tokens)

    def stats(self) -> dict:
        steps = sum(self.matched.values()) or 1
        return {"trie_build_s": self.build_s, "trie_nodes": count_nodes(self.root),
                "trie_match_rate": 1 - self.matched[0] / steps}


def count_nodes(root: TrieNode) -> int:
    total, stack = 0, [root]
    while stack:
        node = stack.pop()
        total += len(node.children)
        stack.extend(node.children.values())
    return total


def build(ctx) -> Drafter:
    n, lp = ctx.opt("n"), ctx.opt("lp")
    return NGramTrie(n, lp, ctx.opt("budget"), ctx.window or ctx.opt("max_depth") or n - 1, bool(ctx.opt("grow")))
