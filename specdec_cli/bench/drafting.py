"""``specdec bench-drafting``: what one drafting step costs, without a target model.

A drafter's ``propose`` runs once per decoding step, so on a fast target (a compiled 7B model on a GPU verifies
in a few milliseconds) its cost must be a small fraction of a millisecond. This times ``propose`` alone on realistic
contexts: the token prefixes of a prompt set (``--prompts``), tokenized with the model's tokenizer only (no
weights are loaded), either each prompt's own prefixes or, with ``--context N``, windows of exactly ``N`` tokens
cut from the concatenated prompts (long-context drafting: PLD and the N-gram trie on 4k-token prompts).

Reported per method: median, p90, p99 and mean milliseconds per step, how often a draft was found, the mean draft
size, and for datastores their size (tokens, shards, bytes per token).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ..config import AUTO_BUDGET, PAPER_BUDGET
from ..errors import SpecdecError


@dataclass
class TokenizerOnly:
    """The parts of a loaded model a drafter needs to be built: tokenizer, fingerprint, vocabulary, stop ids."""

    tokenizer: object
    name: str
    stop_ids: frozenset = field(default_factory=frozenset)

    @property
    def fingerprint(self) -> str:
        from ..io.models import tokenizer_fingerprint

        return tokenizer_fingerprint(self.tokenizer)

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)


def contexts(tokenizer, prompt_set: str, limit: int | None, steps: int, context: int | None,
             min_tokens: int = 8) -> list[tuple[list[int], list[int], list[int]]]:
    """``(prompt, sequence, cuts)`` cases: the drafter starts on ``prompt`` and proposes after ``sequence[:cut]``
    for each cut in turn, the context growing as it does while decoding."""
    from ..io.prompts import load_prompts

    prompts = load_prompts(prompt_set, limit)
    seqs = [tokenizer(p.turns[0], add_special_tokens=True)["input_ids"] for p in prompts]
    out = []
    if context:
        stream = [t for s in seqs for t in s]
        if len(stream) < context + 1:
            raise SpecdecError(f"--context {context}: the prompt set has only {len(stream)} tokens")
        per = 16  # consecutive decoding steps per window
        windows = max(steps // per, 1)
        for start in np.linspace(0, len(stream) - context - 1, num=windows).astype(int).tolist():
            window = stream[start: start + context + 1]
            out.append((window[: context - per], window, list(range(context - per + 1, context + 1))))
    else:
        per = max(steps // max(len(seqs), 1), 1)
        for seq in seqs:
            if len(seq) > min_tokens:
                cuts = np.unique(np.linspace(min_tokens, len(seq), num=per).astype(int)).tolist()
                out.append((seq[:min_tokens], seq, cuts))
    return out


def bench_drafter(drafter, cases, max_tokens: int, learn: bool = False) -> dict:
    """Time ``propose`` over the cases (one ``start`` per case, one growing context list per case).

    ``learn`` (``auto``): time the budget's selection too (the loop counts it as drafting), and hand the drafter
    what a target that wrote exactly the prompt's text would have accepted of the selected draft, so calibration
    and gates run as they do while decoding."""
    from ..engine.sampling import SamplingConfig

    cfg = SamplingConfig()
    seconds, sizes = [], []
    for prompt, seq, cuts in cases:
        drafter.start(list(prompt), cfg, None)
        tokens = list(seq[: cuts[0]])
        for cut in cuts:
            tokens.extend(seq[len(tokens): cut])
            t0 = time.perf_counter()
            draft = drafter.propose(tokens, max_tokens)
            if learn:
                draft = drafter.budget.select(draft).draft
            seconds.append(time.perf_counter() - t0)
            sizes.append(len(draft))
            if learn:
                teach(drafter, tokens, draft, seq[cut: cut + max_tokens + 1])
    ms = np.asarray(seconds) * 1000
    sizes = np.asarray(sizes)
    return {"steps": int(ms.size), "ms_median": float(np.median(ms)), "ms_p90": float(np.percentile(ms, 90)),
            "ms_p99": float(np.percentile(ms, 99)), "ms_mean": float(ms.mean()),
            "found": float((sizes > 0).mean()), "draft_tokens_mean": float(sizes.mean())}


def teach(drafter, tokens: list[int], draft, truth: list[int]) -> None:
    """``drafter.accept`` with the path of ``draft`` that ``truth`` (the text's own continuation) follows."""
    from ..engine.loop import Outcome
    from ..engine.trees import children

    kids, path, node = children(draft.tokens, draft.parents), [], -1
    for tok in truth[:-1]:
        node = kids.get(node, {}).get(tok)
        if node is None:
            break
        path.append(node)
    accepted = [draft.tokens[i] for i in path]
    nxt = truth[len(path)] if len(path) < len(truth) else 0
    drafter.accept(tokens + accepted + [nxt], Outcome(draft, path, accepted, nxt))


def run(method: str, model: str, *, datastore: str | list[str] | None, prompt_set: str, limit: int | None, steps: int,
        context: int | None, options: dict, max_tokens: int = 16) -> dict:
    from ..methods import MethodContext, build_drafter, model_free
    from ..io.models import load_tokenizer

    if method not in model_free():
        raise SpecdecError(f"bench-drafting times drafters that need no model: {', '.join(model_free())}; "
                           f"got {method!r}")
    stores = [datastore] if isinstance(datastore, str) else list(datastore or [])
    if method != "auto" and len(stores) > 1:
        raise SpecdecError(f"--method {method} takes one --datastore (only auto takes several)")
    tokenizer = load_tokenizer(model)
    target = TokenizerOnly(tokenizer, model, frozenset([tokenizer.eos_token_id] if tokenizer.eos_token_id is not None
                                                       else []))
    learn = method == "auto"
    ctx = MethodContext(target, [], None if learn else (stores or [None])[0], None, dict(options),
                        AUTO_BUDGET if learn else PAPER_BUDGET, datastores=stores if learn else [])
    drafter = build_drafter(method, ctx)
    if learn:  # priced like a 50 ms target step whose cost grows 5% per extra token (timing the selection)
        from ..engine.budget import Budget
        from ..runtime.profile import Profile

        drafter.budget = Budget(AUTO_BUDGET, Profile([1, 64], [0.05, 0.05 * (1 + 0.05 * 63)]), gate=False,
                                trust_scores=drafter.calibrated_scores)
    cases = contexts(tokenizer, prompt_set, limit, steps, context)
    if not cases:
        raise SpecdecError(f"no contexts from prompt set {prompt_set!r}")
    bench_drafter(drafter, cases[:2], max_tokens, learn)  # compile / page in / fill caches
    result = {"method": method, "model": model, "prompts": prompt_set, "context": context, "options": options,
              **bench_drafter(drafter, cases, max_tokens, learn)}
    if learn:
        result["sources"] = drafter.stats()["sources"]
    store = getattr(drafter, "store", None) or getattr(drafter, "matrix", None)
    if datastore and store is not None:
        manifest = getattr(store, "manifest", None) or getattr(store, "meta", {})
        result["datastore"] = {"path": datastore, "tokens": manifest.get("num_tokens"),
                               "shards": len(manifest.get("shards", [])) or None}
    return result
