"""``auto``: one drafter that drafts from every source it has at once -- the default method.

Each step every source proposes a small tree of continuations (:mod:`specdec_cli.drafting.sources`): the
request's own context, the memory of earlier outputs, every datastore given, and a draft model's greedy chain
grown from the merged tree's most promising node. Identical paths from two sources become one node
(:class:`~specdec_cli.drafting.union.UnionTree`); each node carries each source's calibrated acceptance estimate,
and the engine's budget keeps the subtree worth its verification time. A source (but the context) whose cost is not
repaid by the tokens only it got accepted is gated (skipped for growing stretches, then probed again).

Every draft is fixed before the target draws and verified by the exact tree walk (the draft model's chain is its
greedy one), so the output is the target's: identical to ``ar`` when greedy, distributed as ``p_target`` when
sampling. Statistics report, per source, the nodes verified and accepted (``sources``).
"""

from __future__ import annotations

import time

import numpy as np

from ..datastore import KINDS
from ..engine import trees
from ..engine.loop import Draft, Drafter, Outcome
from ..drafting.draft_model import DraftModel, confidence, draft_model_for
from ..drafting.gate import Gate
from ..drafting.output_memory import OutputMemory
from ..drafting.sources import ContextSource, MemorySource, Source, rows_to_draft
from ..drafting.union import SourceCalibration, UnionTree, best_subtree, normalise_siblings
from ..errors import SpecdecError

MODEL = "model"
CONFIDENT = 0.7  # the model's chain starts below the tree's nodes this likely to be accepted
MODEL_BELOW = 1.0  # ... and only when the tree promises fewer extra tokens than this
THIS_PROMPT = 16.0  # pseudo-nodes behind the run's calibration when this generation's accepted / expected rescales
# it: the run pools all prompts, and code and chat differ (replays: +1.5% geometric mean over the tuning sets)


class AutoDrafter(Drafter):
    name = "auto"
    gated_by_budget = False  # its context costs ~0.3 ms; every other source has its own gate (Gate)
    calibrated_scores = True  # per source and evidence (SourceCalibration); not pooled a second time (docs/auto.md)

    def __init__(self, sources: list[Source], models: list[DraftModel] = (), *, max_nodes: int = 64,
                 cont_len: int = 32, window: int = 8, memory: OutputMemory | None = None,
                 memory_dir: str | None = None, fingerprint: str = "", calibration: SourceCalibration | None = None):
        self.sources = list(sources)
        self.models = list(models)
        self.max_nodes, self.cont_len, self.window = max_nodes, cont_len, window
        self.memory, self.memory_dir, self.fingerprint = memory, memory_dir, fingerprint
        self.run_calibration = calibration if calibration is not None else SourceCalibration()
        self.calibration = self.run_calibration
        self.gates = {s.name: Gate() for s in self.sources if s.gated}
        if self.models:
            self.gates[MODEL] = Gate(cheap_probe=False)  # its probe first prefills the draft model
        self.totals: dict[str, dict[str, float]] = {}
        self.union, self.step_cost = UnionTree(), {}

    # -- per generation -------------------------------------------------------------------------------------------

    def start(self, prompt, cfg, generator) -> None:
        super().start(prompt, cfg, generator)
        # greedy: the run's calibration, held once for every slot of a batch (at B = 32 a slot alone would learn from
        # a 32nd of the steps); sampled: this generation's own, from the sources' estimates, so its prices never
        # depend on other rows or generations
        self.calibration = self.run_calibration if cfg.greedy else SourceCalibration()
        for source in self.sources:
            source.start(prompt)
        for gate in self.gates.values():  # a source that lost only a little gets a fresh chance
            gate.start()
        for dm in self.models:
            dm.prefill(prompt, now=self.budget.drafting and self.gates[MODEL].skip <= 0)
        self.totals = {}
        self.gen_acc = self.gen_exp = 0.0  # this generation's accepted tested nodes, and their estimates' sum

    def use_target_cache(self, cache) -> None:
        for dm in self.models:
            dm.use_target_cache(cache)

    def finish(self) -> None:
        for source in self.sources:
            source.finish()
        if self.memory is not None and self.memory_dir:
            self.memory.save(self.memory_dir, self.fingerprint)

    # -- checkpoints (bench --resume) ---------------------------------------------------------------------------

    def state(self) -> dict:
        """Everything that carries over from one generation to the next: the per-(source, bucket) calibration,
        the gates, the memory of earlier outputs, and each source's own state under its ``state_key`` (the
        generation that joins the memory at the next start, the tri-gram sources' adapted rows)."""
        out = {"calibration": self.run_calibration.state(), "gates": {name: gate.state() for name, gate in self.gates.items()},
               "memory": self.memory.state() if self.memory is not None else None}
        for key, sources in self._keyed().items():
            out[key] = [s.state() for s in sources]
        return out

    def _keyed(self) -> dict[str, list[Source]]:
        keyed: dict[str, list[Source]] = {}
        for source in self.sources:
            if source.state_key:
                keyed.setdefault(source.state_key, []).append(source)
        return keyed

    def load_state(self, state: dict) -> None:
        cells = SourceCalibration.cells_of(state["calibration"])
        gates = state["gates"]
        if not isinstance(gates, dict) or set(gates) != set(self.gates):
            raise ValueError("gates of other sources")
        keyed = self._keyed()
        extra = set(state) - {"calibration", "gates", "memory", *keyed}
        if (state["memory"] is None) != (self.memory is None) or any(state[k] for k in extra) \
                or any(len(state.get(k) or []) != len(sources) for k, sources in keyed.items()):
            raise ValueError("state of other sources")
        for name, gate in self.gates.items():
            gate.load_state(gates[name])
        self.run_calibration.cells = cells
        self.calibration = self.run_calibration
        if self.memory is not None:
            self.memory.load_state(state["memory"])
        for key, sources in keyed.items():
            for source, data in zip(sources, state[key]):
                source.load_state(data)

    # -- drafting -------------------------------------------------------------------------------------------------

    def propose(self, tokens: list[int], max_tokens: int) -> Draft:
        length = min(self.cont_len, max_tokens)
        self.union, self.step_cost = UnionTree(), {}
        if length < 1:
            return Draft()
        greedy = self.cfg.greedy
        for source in self.sources:
            gate = self.gates.get(source.name)
            if gate is not None and not gate.open():
                continue
            t0 = time.perf_counter()
            for draft, bucket in source.propose(tokens, length):
                self.union.add(draft, source.name, bucket)
            self.step_cost[source.name] = time.perf_counter() - t0 if greedy else source.cost_s
        cond = self.calibration.combined(self.union)
        if self.models and self.tree_promise(cond) < MODEL_BELOW and self.gates[MODEL].open():
            cond = self.grow_model_chain(tokens, cond, length)
        cond = np.minimum(cond * (self.gen_acc + THIS_PROMPT) / (self.gen_exp + THIS_PROMPT), 1.0)
        draft, _ = best_subtree(self.union, normalise_siblings(self.union.parents, cond), self.max_nodes)
        draft.cost_s = sum(self.step_cost.values())
        return draft

    def tree_promise(self, cond) -> float:
        """The tokens the merged tree's likeliest nodes are expected to add (a draft model is consulted only when
        the cheap sources promise little: on this CPU a model chain costs as much as a target step or more)."""
        if not len(self.union):
            return 0.0
        probs = trees.path_probs(self.union.parents, normalise_siblings(self.union.parents, cond))
        return float(np.sort(probs)[::-1][:8].sum())

    def grow_model_chain(self, tokens: list[int], cond, length: int):
        """The first draft model's greedy chain, from the end of the tree's confident path (the root when the tree
        is not confident), for as long as the budget says one more draft-model forward pays."""
        dm, union = self.models[0], self.union
        node, path_prob = -1, 1.0
        while True:
            kids = [i for i, p in enumerate(union.parents) if p == node]
            best = max(kids, key=lambda i: cond[i], default=None)
            if best is None or cond[best] < CONFIDENT or union.depths[best] >= length:
                break
            node, path_prob = best, path_prob * cond[best]
        depth = union.depths[node] if node >= 0 else 0
        room = min(self.window, length - depth)
        t0 = time.perf_counter()
        chain, scores, cost = self.model_chain(dm, tokens + union.path(node), room, depth, path_prob)
        union.add(Draft.chain(chain, scores=scores), MODEL, 0, under=node)
        self.step_cost[MODEL] = time.perf_counter() - t0 if self.cfg.greedy else cost
        return self.calibration.combined(union)  # nodes the chain merged into gained the model's estimate

    def model_chain(self, dm, prefix: list[int], room: int, depth: int, path_prob: float):
        """The draft model's greedy chain after ``prefix`` (target ids), at most ``room`` tokens, while the budget
        says one more draft-model forward pays; a draft of another tokenizer drafts in its own tokens, translated
        (one token more, since the last translated one may still change). Returns (chain, scores, cost)."""
        bridge = dm.bridge
        own = bridge.draft_context(prefix) if bridge is not None else prefix
        if not own:
            return [], [], 0.0
        limit = room + 1 if bridge is not None else room
        logits = dm.logits_after(own)
        cost = dm.profile(dm.fed)
        chain, scores = [], []
        cal = self.calibration.calibrator(MODEL, 0)
        while len(chain) < limit:
            x, conf = int(logits.argmax()), confidence(logits)
            chain.append(x)
            scores.append(conf)
            c = float(cal.estimate([depth + len(chain)], [conf])[0])
            path_prob *= c
            if len(chain) >= limit or not self.budget.extend(path_prob, c, depth + len(chain), dm.profile(1)):
                break
            cost += dm.profile(1)
            logits = dm.step(x)
        if bridge is not None:
            chain, cover = dm.translate(chain, room)
            scores = [scores[j] for j in cover]
        return chain, scores, cost

    # -- learning -------------------------------------------------------------------------------------------------

    def accept(self, tokens: list[int], outcome: Outcome) -> None:
        for source in self.sources:
            source.accept(tokens, len(outcome.accepted) + 1)
        verified = outcome.draft
        if not len(verified):
            for name, cost in self.step_cost.items():
                self._record(name, 0, 0, 0, cost)
            self.step_cost = {}
            return
        nodes = self.union.locate(verified)
        on_path = set(outcome.path)
        tested_parents = {-1, *outcome.path}
        tested = [i for i, p in enumerate(verified.parents) if p in tested_parents]
        self.calibration.observe(self.union, [nodes[i] for i in tested], [i in on_path for i in tested])
        self.gen_exp += sum(verified.scores[i] for i in tested) if verified.scores else 0.0
        self.gen_acc += sum(i in on_path for i in tested)
        verified_by, accepted_by, only_by, alone = {}, {}, {}, {}
        for i, node in enumerate(nodes):
            names = self.union.raw[node]
            for name in names:
                verified_by[name] = verified_by.get(name, 0) + 1
                if len(names) == 1:
                    alone[name] = alone.get(name, 0) + 1
                if i in on_path:
                    accepted_by[name] = accepted_by.get(name, 0) + 1
                    if len(names) == 1:
                        only_by[name] = only_by.get(name, 0) + 1
        n, profile = len(verified), self.budget.profile
        for name in set(self.step_cost) | set(verified_by):
            # what the source cost this step: its drafting, and verifying the nodes no other source proposed
            extra = profile(n + 1) - profile(n - alone.get(name, 0) + 1)
            self._record(name, verified_by.get(name, 0), accepted_by.get(name, 0), only_by.get(name, 0),
                         self.step_cost.get(name, 0.0), extra)
        self.step_cost = {}

    def _record(self, name: str, verified: int, accepted: int, only: int, cost_s: float,
                verify_s: float = 0.0) -> None:
        row = self.totals.setdefault(name, {"steps": 0, "verified": 0, "accepted": 0, "accepted_only": 0,
                                            "draft_s": 0.0})
        row["steps"] += name in self.step_cost
        row["verified"] += verified
        row["accepted"] += accepted
        row["accepted_only"] += only
        row["draft_s"] += cost_s
        gate = self.gates.get(name)
        if gate is not None and name in self.step_cost:
            gate.record(only, cost_s + verify_s, self.budget.value)

    def stats(self) -> dict:
        sources = {}
        for name, row in self.totals.items():
            gate = self.gates.get(name)
            sources[name] = {**{k: (round(v, 6) if isinstance(v, float) else v) for k, v in row.items()},
                             "gated_steps": gate.gated if gate else 0}
        return {"sources": sources}


def build(ctx) -> Drafter:
    sources: list[Source] = []
    if ctx.opt("context"):
        sources.append(ContextSource(max_n=ctx.opt("max_ngram"), top_c=ctx.opt("top_c")))
    memory = memory_dir = None
    if ctx.opt("memory"):
        # one memory for every slot of a batch: a prompt drafts from outputs finished in other rows; the first
        # drafter (which made it) saves it
        memory, owner = ctx.held_once("memory", lambda: load_memory(ctx))
        memory_dir = (ctx.opt("memory_dir") or None) if owner else None
        sources.append(MemorySource(memory, top_c=ctx.opt("top_c")))
    elif ctx.opt("memory_dir"):
        raise SpecdecError("--memory DIR needs the memory on (drop --opt memory=0)")
    for folder in ctx.datastores:
        kind, store = ctx.store(folder)
        sources.append(KINDS[kind].auto_source().for_store(store, top_c=ctx.opt("top_c")))
    names = [s.name for s in sources]
    for name in set(names):  # two stores of one kind: tell their statistics apart
        if names.count(name) > 1:
            for k, s in enumerate(x for x in sources if x.name == name):
                s.name = f"{name}{k + 1}"
    calibration, _ = ctx.held_once("calibration", SourceCalibration)  # learnt from every slot's verified steps
    rows_to_draft(np.array([[1, 2, -1]]), 2)  # compiled code loaded (or compiled) now, not in the first step
    models = [draft_model_for(d, ctx.target, ctx.budget.adaptive) for d in ctx.drafts[:1]]
    return AutoDrafter(sources, models, max_nodes=ctx.opt("max_nodes"), cont_len=ctx.opt("cont_len"),
                       window=ctx.window or ctx.opt("model_window"), memory=memory, memory_dir=memory_dir,
                       fingerprint=ctx.target.fingerprint, calibration=calibration)


def load_memory(ctx) -> OutputMemory:
    """The memory of earlier outputs: ``--memory DIR``'s, else a new one (``memory_tokens`` bound)."""
    memory_dir, size = ctx.opt("memory_dir") or None, ctx.opt("memory_tokens")
    if memory_dir:
        return OutputMemory.load(memory_dir, ctx.target.fingerprint, ctx.target.vocab_size, size)
    return OutputMemory(size)
