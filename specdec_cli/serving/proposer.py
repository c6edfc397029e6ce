"""specdec's drafter as a vLLM proposer (``speculative_config={"method": "custom_class", "model":
"specdec_cli.serving.proposer.SpecdecProposer", "num_speculative_tokens": K}``), and the worker extension that
reads its statistics back (``worker_extension_cls="specdec_cli.serving.proposer.SpecdecWorkerExtension"``).

vLLM builds the proposer in each worker process with its ``VllmConfig`` alone, so what the drafter drafts from
comes in the environment variable :data:`ENV` (JSON, written by :mod:`specdec_cli.serving.vllm_engine`; inherited
by vLLM's worker processes): the memory (on, size, folder), the datastores, the tokenizer's fingerprint. vLLM
calls ``propose`` once per step for the whole batch (its model runners' ``propose_draft_token_ids``); on the CPU it
also calls ``load_model``.

The interface drafts chains from token ids, without draft probabilities: vLLM verifies them as deterministic
drafts (greedy: identical to plain decoding; sampling: its rejection sampler with a point-mass ``q_draft``, exact).
"""

from __future__ import annotations

import copy
import json
import os

import numpy as np

from . import ENV
from .chain_sources import ContextChains, MemoryChains, rows_chain
from .chains import ChainDrafter
from .rows import RowTracker



def read_settings() -> dict:
    """The drafter's settings from :data:`ENV` (defaults: context and memory on, no datastore)."""
    raw = os.environ.get(ENV, "")
    settings = json.loads(raw) if raw else {}
    return {"context": True, "memory": True, "memory_dir": None, "memory_tokens": None, "datastores": [],
            "fingerprint": "", **settings}


def build_drafter(settings: dict, vocab_size: int) -> ChainDrafter:
    """The chain drafter ``settings`` describe: the memory (loaded from its folder when given) and every
    datastore, opened once for all the sequences the engine serves."""
    from ..datastore import KINDS, open_store
    from ..drafting.output_memory import MAX_TOKENS, OutputMemory

    sources, memory = [], None
    if settings["context"]:
        sources.append(ContextChains())
    if settings["memory"]:
        size = settings["memory_tokens"] or MAX_TOKENS
        folder = settings["memory_dir"]
        memory = OutputMemory.load(folder, settings["fingerprint"], vocab_size, size) if folder else OutputMemory(size)
        sources.append(MemoryChains(memory))
    stores = []
    for folder in settings["datastores"]:
        kind, store = open_store(folder, settings["fingerprint"] or None)
        stores.append(KINDS[kind].chain_source()(store))
    names = [s.name for s in stores]
    for s in stores:  # two stores of one kind: tell their statistics apart (as auto does)
        if names.count(s.name) > 1:
            s.name = f"{s.name}{names[: stores.index(s) + 1].count(s.name)}"
    rows_chain(np.array([[1, 2, -1]]), 1.0)  # compiled code loaded (or compiled) now, not in the first step
    return ChainDrafter(sources + stores, memory)


class SpecdecProposer:
    """vLLM's ``custom_class`` proposer: one :class:`ChainDrafter` for every request the engine serves."""

    def __init__(self, vllm_config):
        spec = vllm_config.speculative_config
        self.settings = read_settings()
        self.max_draft = int(spec.num_speculative_tokens)
        model_config = vllm_config.model_config
        self.drafter = build_drafter(self.settings, int(model_config.get_vocab_size()))
        self.rows = RowTracker(self.drafter, self.max_draft, int(model_config.max_model_len))

    def load_model(self, *args, **kwargs) -> None:
        """Nothing to load: the drafter reads token ids only (vLLM's CPU runner calls this)."""

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None, **kwargs):
        """One chain per batch row: ``sampled_token_ids[i]`` are the tokens row ``i`` gained this step (empty while
        it prefills), ``token_ids_cpu[i, :num_tokens_no_spec[i]]`` its whole sequence."""
        return self.rows.propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)

    def stats(self, reset: bool = False) -> dict:
        return self.drafter.stats(reset)

    def mark(self) -> None:
        """bench's warm-up begins: what the drafter knows now is what the timed run must start from."""
        d = self.drafter
        self._mark = (copy.deepcopy((d.calibration, d.cost, d.gates)), d.memory.state() if d.memory else None)

    def back_to_mark(self) -> None:
        """bench's warm-up ended: forget what it taught. Its answers are the first tokens of timed prompts, which
        the memory would hand back."""
        self.finish(save=False)  # the warm-up's sequences end; what they add to the memory is undone below
        d = self.drafter
        (d.calibration, d.cost, d.gates), memory = self._mark
        d.pending = {}
        if memory is not None:
            d.memory.load_state(memory)  # in place: its source holds it

    def finish(self, save: bool = True) -> None:
        """Every live sequence joins the memory, which is saved to its folder (``--memory``) when ``save``."""
        for seq in list(self.rows.live):
            self.drafter.end(seq)
        self.rows.live.clear()
        folder, memory = self.settings["memory_dir"], self.drafter.memory
        if save and folder and memory is not None:
            memory.save(folder, self.settings["fingerprint"])


class SpecdecWorkerExtension:
    """Methods vLLM adds to its worker class, called with ``LLM.collective_rpc(name)``."""

    def _specdec_proposer(self):
        drafter = getattr(getattr(self, "model_runner", None), "drafter", None)
        return drafter if isinstance(drafter, SpecdecProposer) else None

    def specdec_stats(self, reset: bool = False) -> dict | None:
        proposer = self._specdec_proposer()
        return proposer.stats(reset) if proposer is not None else None

    def specdec_mark(self, back: bool = False) -> bool:
        """``back=False``: :meth:`SpecdecProposer.mark`; ``back=True``: :meth:`SpecdecProposer.back_to_mark`."""
        proposer = self._specdec_proposer()
        if proposer is not None:
            proposer.back_to_mark() if back else proposer.mark()
        return proposer is not None

    def specdec_finish(self) -> bool:
        """Every rank drafts the same chains from the same tokens; the first alone saves the memory."""
        proposer = self._specdec_proposer()
        if proposer is not None:
            proposer.finish(save=getattr(self, "rank", 0) == 0)
        return proposer is not None
