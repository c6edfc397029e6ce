"""A draft model with its own KV cache, kept in step with the target's sequence by cropping.

Used by every model-drafting method (``sd``, ``self-verify``, ``hsddw``). The cache holds a prefix of the
sequence; :meth:`DraftModel.logits_after` brings it up to date (cropping whatever the target rejected) and
returns the next-token logits, and :meth:`DraftModel.step` extends it by one drafted token.
"""

from __future__ import annotations

import torch

from . import engine


class DraftModel:
    def __init__(self, loaded, vocab_size: int):
        self.loaded = loaded
        self.model = loaded.model
        self.vocab_size = vocab_size  # the target's logit width; draft logits are cut/padded to it
        self.reset()

    def reset(self) -> None:
        self.cache = engine.new_cache()
        self.seen: list[int] = []  # tokens whose keys/values are in the cache

    def fit_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """Cut or pad (with -inf) draft logits to the target's vocabulary width."""
        v = logits.shape[-1]
        if v == self.vocab_size:
            return logits
        if v > self.vocab_size:
            return logits[..., : self.vocab_size]
        pad = logits.new_full((*logits.shape[:-1], self.vocab_size - v), float("-inf"))
        return torch.cat([logits, pad], dim=-1)

    def logits_after(self, tokens: list[int]) -> torch.Tensor:
        """Next-token logits ``[V]`` after ``tokens``; the cache ends up holding all of ``tokens``."""
        common = 0
        limit = min(len(self.seen), len(tokens) - 1)  # always feed at least the last token
        while common < limit and self.seen[common] == tokens[common]:
            common += 1
        engine.crop(self.cache, common)
        logits = engine.forward_chain(self.model, self.cache, tokens[common:])
        self.seen = list(tokens)
        return self.fit_vocab(logits[-1]).cpu()

    def step(self, token: int) -> torch.Tensor:
        """Feed one more token; returns the logits after it."""
        logits = engine.forward_chain(self.model, self.cache, [token])
        self.seen.append(token)
        return self.fit_vocab(logits[-1]).cpu()
