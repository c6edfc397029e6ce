"""``aded``: Adaptive Draft-Verification (Liu et al.) -- tri-gram matrix + MCTS draft maker, adaptive updates.

Each step the MCTS (:mod:`specdec_cli.drafting.mcts`) searches continuations of the last two tokens in the tri-gram
matrix; the best ``candidates`` are prefix-merged into a token tree that the target verifies exactly. The
prompt and then every verified output update the matrix (Algorithm 2) in an in-memory overlay over the
memory-mapped store, so the drafts follow what this model actually writes. The overlay persists across the
generations of one drafter and can be written out as a new store with :meth:`Aded.save_adapted`.

Options (``--opt key=value``, defaults in the registry ``specdec_cli.methods.METHODS``; ``specdec methods``
lists them). ``specdec generate --save-adapted PATH`` (or ``--opt save_adapted=PATH``) writes the adapted matrix
once, after the last prompt (:meth:`Aded.finish`).
"""

from __future__ import annotations

import random
import time

import numpy as np

from ..engine.loop import Draft, Drafter, Outcome
from ..drafting.mcts import MCTSConfig, run_mcts
from ..engine.trees import merge_paths
from ..datastore import TrigramMatrix


class Aded(Drafter):
    name = "aded"

    def __init__(self, matrix: TrigramMatrix, cfg: MCTSConfig = MCTSConfig(), *, adapt: bool = True,
                 adapt_prompt: bool = True, increment: float = 0.1, max_prob: float = 1.0, seed: int = 0,
                 save_path: str = ""):
        self.matrix, self.mcts = matrix, cfg
        self.save_path = save_path
        self.adapt, self.adapt_prompt = adapt, adapt_prompt
        self.increment, self.max_prob = increment, max_prob
        self.seed = seed
        self._reset_stats()

    def _reset_stats(self) -> None:
        self.mcts_s = 0.0
        self.searches = 0
        self.empty = 0
        self.candidates = 0

    def start(self, prompt, cfg, generator) -> None:
        super().start(prompt, cfg, generator)
        self.rng = random.Random(self.seed)
        self.matrix.clear_cache()  # bounds the probability cache to one generation
        self._reset_stats()
        if self.adapt_prompt:  # Fig. 2: the input's tri-grams update the matrix before drafting
            self.learn(prompt)

    def state(self) -> dict:
        """The adapted tri-gram rows (Algorithm 2 carries over from one generation to the next)."""
        return {"overlay": self.matrix.overlay_state()}

    def load_state(self, state: dict) -> None:
        self.matrix.load_overlay_state(state["overlay"])

    def learn(self, tokens: list[int]) -> None:
        self.matrix.adjust(tokens, increment=self.increment, max_prob=self.max_prob)

    def propose(self, tokens: list[int], max_tokens: int) -> Draft:
        depth = min(self.mcts.depth, max_tokens)
        if depth < 1:
            return Draft()
        prev = tokens[-2] if len(tokens) > 1 else tokens[-1]
        t0 = time.perf_counter()
        found = run_mcts(self.matrix, prev, tokens[-1], self.mcts, self.rng, depth)
        self.mcts_s += time.perf_counter() - t0
        self.searches += 1
        self.empty += not found
        self.candidates += len(found)
        draft = merge_paths([seq for seq, _ in found], depth)
        draft.scores = self.node_probs(draft, prev, tokens[-1])
        return draft

    def node_probs(self, draft: Draft, prev: int, root: int) -> list[float]:
        """Each node's tri-gram probability given its two predecessors: the matrix's own acceptance estimate
        (all nodes' rows gathered at once)."""
        n = len(draft.tokens)
        if not n:
            return []
        a, b = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
        for i, parent in enumerate(draft.parents):
            a[i], b[i] = (prev, root) if parent < 0 else (b[parent], draft.tokens[parent])
        offsets, ids, probs = self.matrix.gather(a * self.matrix.vocab_size + b)
        row = np.repeat(np.arange(n), np.diff(offsets))
        hit = ids == np.asarray(draft.tokens, dtype=np.int64)[row]
        out = np.zeros(n)
        out[row[hit]] = probs[hit]
        return out.tolist()

    def accept(self, tokens: list[int], outcome: Outcome) -> None:
        """Algorithm 2 over the tri-grams that end in this step's new tokens (each tri-gram counted once)."""
        if self.adapt:
            new = len(outcome.accepted) + 1
            self.learn(tokens[-(new + 2):])

    def save_adapted(self, path) -> dict:
        """Write base + adapted rows as a new tri-gram store (same format, loadable with ``--datastore``)."""
        return self.matrix.save(path)

    def finish(self) -> None:
        if self.save_path:
            self.save_adapted(self.save_path)

    def stats(self) -> dict:
        steps = max(self.searches, 1)
        return {"mcts_s": self.mcts_s, "mcts_ms_per_step": 1000 * self.mcts_s / steps,
                "mcts_candidates_per_step": self.candidates / steps, "mcts_empty_steps": self.empty,
                "adapted_contexts": len(self.matrix.overlay)}


def build(ctx) -> Drafter:
    # batch slots adapt one tri-gram matrix (the first drafter's view of the store), which the first saves
    matrix, owner = ctx.held_once("matrix", lambda: ctx.store(ctx.datastore)[1])
    matrix.top_k = ctx.opt("top_k") or matrix.top_k
    depth = ctx.opt("depth") if "depth" in ctx.options or not ctx.window else ctx.window
    cfg = MCTSConfig(iterations=ctx.opt("iterations"), c1=ctx.opt("c1"), c2=ctx.opt("c2"), depth=depth,
                     candidates=ctx.opt("candidates"))
    return Aded(matrix, cfg, adapt=bool(ctx.opt("adapt")), adapt_prompt=bool(ctx.opt("adapt_prompt")),
                increment=ctx.opt("increment"), max_prob=ctx.opt("max_prob"), seed=ctx.opt("seed"),
                save_path=ctx.opt("save_adapted") if owner else "")
