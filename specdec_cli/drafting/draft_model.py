"""A draft model with its own KV cache, kept in step with the target's sequence by cropping, and the one loop
every model-drafting method (``sd``, ``self-verify``, ``hsddw``) drafts a chain with.

:meth:`DraftModel.logits_after` brings the cache up to date (cropping whatever the target rejected, feeding what
it has not seen -- several tokens at once after steps that did not draft) and returns the next-token logits;
:meth:`DraftModel.step` extends it by one drafted token. :func:`draft_chain` samples (or, greedy, takes the argmax
of) one token at a time and stops at the window cap, when the draft's entropy exceeds ``tau`` (HSDDW's
self-verification; ``inf`` for ``sd``), or when the budget says one more draft-model forward is not worth it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..runtime import forward
from ..runtime import kvcache
from ..runtime import static_cache
from ..runtime.cache_mode import CacheMode
from ..engine.sampling import SamplingConfig, entropy, logits_to_probs, sample
from ..engine.trees import Draft

GREEDY = SamplingConfig()


class DraftModel:
    def __init__(self, loaded, vocab_size: int, profiled: bool = False, bridge=None):
        """``profiled``: measure (or load) the forward-time profile now, not inside the first timed step.
        ``bridge``: a :class:`~specdec_cli.drafting.token_bridge.TokenBridge` when the draft's tokenizer is not the
        one it drafts for (:func:`draft_model_for`); its logits then keep its own width."""
        self.loaded = loaded
        self.model = loaded.model
        self.bridge = bridge
        self.stop_ids = frozenset(getattr(loaded, "stop_ids", ()) or ()) if bridge is not None else frozenset()
        self.vocab_size = vocab_size  # the target's logit width; draft logits are cut/padded to it
        self._profile = None
        self.target_cache = None
        self.cache_mode, self.capacity = CacheMode.EAGER, kvcache.MIN_CAPACITY  # the target's (use_target_cache)
        self.reset()
        if profiled:
            _ = self.profile

    @property
    def slot(self) -> str:
        return f"draft-{id(self)}"  # its own static cache: the drafters of a bench run share the model, not the rows

    def reset(self) -> None:
        self.cache = forward.new_cache(self.model, self.capacity, self.cache_mode, slot=self.slot)
        self.seen: list[int] = []  # tokens whose keys/values are in the cache
        self.exact = 0  # how many of them hold the target's own keys/values (copied from its cache)
        self.fed = 0  # tokens fed by the last logits_after

    def use_target_cache(self, cache) -> None:
        """Let a draft that is a copy of the target (``int8:``, ``bf16:``) take the keys/values of tokens the target
        has already processed from the target's cache -- the prompt and every accepted token -- instead of
        computing them itself: no draft prefill, no catch-up forward after steps that did not draft, and a draft
        that conditions on the target's exact states. Verification is unchanged, so this is lossless.

        Every draft model also follows the target onto its path (``cache.mode``; the static, compiled one:
        :mod:`specdec_cli.runtime.static_cache`): a launch-bound eager draft would cost more than a compiled target
        step."""
        if cache.mode is not self.cache_mode:
            self._profile = None  # forward times of the path this draft now runs on (measured when first needed)
        self.cache_mode = cache.mode
        self.capacity = cache.companion_capacity() * (2 if self.bridge is not None else 1)  # its tokens may be more
        if self.loaded.info.get("copy_of_target") and self.bridge is None:  # its rows are the target's rows
            self.target_cache = cache
            cache.keep_module_bits()  # ... as the module code writes them (a batch's: not batch_rows' rounding)
        # The buckets bench compiled for this model are called in its own cache now (under CUDA graphs: recorded),
        # in the first generation -- bench's untimed warm-up -- not in a timed draft step: on an H200, compiled
        # `auto` with a bf16: draft spent 4.0 s in 4 draft steps where it first needed larger buckets (docs/gpu.md).
        static_cache.warm_compiled(self.model, self.cache_mode, self.capacity, self.slot)

    @property
    def profile(self):
        """This draft model's measured forward times (:mod:`specdec_cli.runtime.profile`), loaded on first use."""
        if self._profile is None:
            from ..runtime.profile import profile_for

            self._profile = profile_for(self.model, cache_mode=self.cache_mode)
        return self._profile

    def fit_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """Cut or pad (with -inf) draft logits to the target's vocabulary width."""
        v = logits.shape[-1]
        if v == self.vocab_size:
            return logits
        if v > self.vocab_size:
            return logits[..., : self.vocab_size]
        pad = logits.new_full((*logits.shape[:-1], self.vocab_size - v), float("-inf"))
        return torch.cat([logits, pad], dim=-1)

    def sync(self, tokens: list[int], feed: int = 1) -> int:
        """Crop the cache to the longest prefix it shares with ``tokens`` that leaves at least ``feed`` tokens to
        feed, then (with a target cache) take whatever more the target has computed; returns the cached length."""
        common = 0
        limit = min(len(self.seen), len(tokens) - feed)
        while common < limit and self.seen[common] == tokens[common]:
            common += 1
        if self.target_cache is not None:  # the target's states beat our own approximations of them
            common = min(common, self.exact)
            ready = min(len(tokens) - feed, forward.cache_len(self.target_cache))
            if ready > common and self.cache.copy_prefix(self.target_cache, common, ready, self.model.dtype):
                common = self.exact = ready
                self.seen = list(tokens[:ready])
        forward.crop(self.cache, common)
        return common

    def prefill(self, prompt: list[int], now: bool = True) -> None:
        """Cache the prompt (all but its last token, which the first draft feeds), computing no logits: done once
        per generation, with the target's prefill, instead of inside the first drafting step. With ``now=False``
        (the budget will not draft soon) nothing is fed: a later draft catches up if it ever comes."""
        self.reset()
        if now and self.bridge is not None:
            prompt = self.bridge.draft_context(prompt)
        if now and len(prompt) > 1 and self.target_cache is None:
            forward.forward_chain(self.model, self.cache, prompt[:-1], keep=0)
            self.seen = list(prompt[:-1])

    def logits_rows(self, tokens: list[int], rows: int) -> torch.Tensor:
        """Logits of the last ``rows`` positions of ``tokens`` (``[rows, V]``), feeding what the cache lacks."""
        common = self.sync(tokens, rows)
        self.fed = len(tokens) - common
        logits = forward.forward_chain(self.model, self.cache, tokens[common:], keep=rows)
        self.seen = list(tokens)
        return self.fit_vocab(logits).cpu()

    def logits_after(self, tokens: list[int]) -> torch.Tensor:
        """Next-token logits ``[V]`` after ``tokens``; the cache ends up holding all of ``tokens``."""
        return self.logits_rows(tokens, 1)[-1]

    def translate(self, own_tokens: list[int], k: int) -> tuple[list[int], list[int]]:
        """A chain of this draft's own tokens (after :meth:`TokenBridge.draft_context`'s) as at most ``k`` token ids
        of the model it drafts for, and for each the index of the own token holding its last byte. The chain ends at
        the draft's end of text, which settles its last translated token."""
        stop = next((i for i, t in enumerate(own_tokens) if t in self.stop_ids), None)
        ids, cover = self.bridge.to_target(own_tokens[:stop], final=stop is not None)
        return ids[:k], cover[:k]

    def step(self, token: int) -> torch.Tensor:
        """Feed one more token; returns the logits after it."""
        logits = forward.forward_chain(self.model, self.cache, [token], keep=1)
        self.seen.append(token)
        return self.fit_vocab(logits[-1]).cpu()


def confidence(logits: torch.Tensor) -> float:
    """The draft's top probability ``max softmax(logits)`` without materialising the softmax."""
    logits = logits.float()
    return float(1.0 / torch.exp(logits - logits.max()).sum())


def confidence_entropy(logits: torch.Tensor, q_draft: torch.Tensor | None, cfg: SamplingConfig) -> float:
    """The entropy (nats) HSDDW's self-verify rule compares with ``tau``.

    When sampling it is the entropy of ``q_draft`` itself, the distribution the token is drawn from. When
    greedy (no ``q_draft``: it would be one-hot, entropy 0, and the rule would never fire) it is the entropy of
    the model's untempered softmax, its own confidence.
    """
    probs = logits.float().softmax(-1) if cfg.greedy or q_draft is None else q_draft
    return float(entropy(probs))


@dataclass
class Chain:
    """A drafted chain: the tokens, ``q_draft`` rows (sampling only), per-token confidence and entropy."""

    tokens: list[int] = field(default_factory=list)
    q_rows: list[torch.Tensor] = field(default_factory=list)
    confidences: list[float] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)
    cost_s: float = 0.0  # predicted draft-model time (from its measured profile)

    def draft(self) -> Draft:
        q = torch.stack(self.q_rows) if self.q_rows else None
        return Draft.chain(self.tokens, q, self.confidences, self.cost_s) if self.tokens else Draft()


def draft_model_for(loaded, reference, profiled: bool = False) -> DraftModel:
    """A :class:`DraftModel` that drafts for ``reference`` (the target; for hsddw's fast draft, the stronger one):
    token ids as they are when both share a tokenizer, else carried across by a
    :class:`~specdec_cli.drafting.token_bridge.TokenBridge`."""
    from ..io.models import same_vocab

    if same_vocab(reference, loaded):
        return DraftModel(loaded, reference.vocab_size, profiled)
    from .token_bridge import TokenBridge, byte_vocab

    bridge = TokenBridge(byte_vocab(reference.tokenizer), byte_vocab(loaded.tokenizer))
    return DraftModel(loaded, loaded.vocab_size, profiled, bridge)


def draft_chain(dm: DraftModel, tokens: list[int], k: int, cfg: SamplingConfig, generator, budget=None, *,
                tau: float = math.inf, entropies: bool = False) -> Chain:
    """Draft at most ``k`` tokens after ``tokens`` with the draft model; a draft of another tokenizer drafts
    greedily in its own tokens (:func:`bridged_chain`)."""
    if getattr(dm, "bridge", None) is not None:  # (test doubles have none)
        return bridged_chain(dm, tokens, k, budget, tau=tau, entropies=entropies)
    return own_chain(dm, tokens, k, cfg, generator, budget, tau=tau, entropies=entropies)


def bridged_chain(dm: DraftModel, tokens: list[int], k: int, budget=None, *, tau: float = math.inf,
                  entropies: bool = False) -> Chain:
    """A draft of another tokenizer: its greedy chain after the target's text, as target token ids (each with the
    confidence and entropy of the draft token holding its last byte). The chain is a fixed candidate (no
    ``q_draft``), verified by the exact tree walk: lossless greedy and sampled alike."""
    context = dm.bridge.draft_context(tokens)
    if k <= 0 or not context:
        return Chain()
    own = own_chain(dm, context, k + 1, GREEDY, None, budget, tau=tau, entropies=entropies)
    ids, cover = dm.translate(own.tokens, k)
    return Chain(ids, [], [own.confidences[j] for j in cover],
                 [own.entropies[j] for j in cover] if own.entropies else [], own.cost_s)


def own_chain(dm: DraftModel, tokens: list[int], k: int, cfg: SamplingConfig, generator, budget=None, *,
              tau: float = math.inf, entropies: bool = False) -> Chain:
    """Draft at most ``k`` tokens after ``tokens`` (the draft's own token ids) with the draft model.

    Stops after the first token whose entropy exceeds ``tau`` (the token itself is still sent, as in HSDDW), or
    when ``budget.extend`` says the next draft-model forward would not pay for itself. The draft model is not fed
    the last drafted token: the next call's ``logits_after`` does that (or crops it away if rejected). Every
    stopping decision about position ``i + 1`` looks only at positions ``<= i``, so rejection sampling stays exact.
    """
    chain = Chain()
    if k <= 0:
        return chain
    logits = dm.logits_after(tokens)
    adaptive = budget is not None and not budget.mode.paper
    if adaptive:
        chain.cost_s = dm.profile(dm.fed)
    path_prob = 1.0
    while True:
        q = None if cfg.greedy else logits_to_probs(logits, cfg)
        x = int(logits.argmax()) if q is None else sample(q, generator)
        conf = confidence(logits) if q is None else float(q.max())
        chain.tokens.append(x)
        chain.confidences.append(conf)
        if q is not None:
            chain.q_rows.append(q)
        if entropies or math.isfinite(tau):
            chain.entropies.append(confidence_entropy(logits, q, cfg))
        n = len(chain.tokens)
        if n >= k or (chain.entropies and chain.entropies[-1] > tau):
            return chain
        if adaptive:
            cond = budget.calibrate_one(n, conf)
            path_prob *= cond
            if not budget.extend(path_prob, cond, n, dm.profile(1)):
                return chain
            chain.cost_s += dm.profile(1)
        logits = dm.step(x)
