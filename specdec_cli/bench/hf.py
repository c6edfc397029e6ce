"""transformers' own ``generate`` as bench baselines (``hf``, ``hf-assisted``, ``hf-pld``, ``hf-static``: the
entries of :mod:`specdec_cli.bench.baselines`), timed like specdec's runners; ``throughput`` reuses the arguments
and the forward counter for its batched ``generate``."""

from __future__ import annotations

import time

import torch

from ..engine.loop import cut_at_stop
from ..errors import SpecdecError
from ..io.models import same_vocab
from .config import HF_PLD_TOKENS, BenchConfig, Generation, Runner


class ForwardCounter:
    """Counts forward calls of a module (a pre-hook: no effect on the computation, negligible cost)."""

    def __init__(self, module: torch.nn.Module):
        self.calls = 0
        self.handle = module.register_forward_pre_hook(self._hook)

    def _hook(self, module, args) -> None:
        self.calls += 1

    def close(self) -> None:
        self.handle.remove()


def hf_kwargs(method: str, target, drafts, cfg: BenchConfig) -> dict:
    """``generate`` arguments matching our loop: same budget, stop ids and sampling; no minimum length."""
    stop = sorted(target.stop_ids)
    pad = getattr(target.tokenizer, "pad_token_id", None)
    kwargs: dict = dict(eos_token_id=stop or None, pad_token_id=pad if pad is not None else (stop or [0])[0],
                        do_sample=not cfg.greedy, min_new_tokens=0)
    if cfg.greedy:
        kwargs.update(temperature=None, top_p=None, top_k=None)
    else:
        kwargs.update(temperature=cfg.settings.sampling.temperature, top_p=1.0, top_k=0)
    if method == "hf-assisted":
        if not drafts:
            raise SpecdecError("method hf-assisted needs a draft model (--draft)")
        kwargs["assistant_model"] = drafts[0].model
        if not same_vocab(target, drafts[0]):  # Universal Assisted Generation: transformers re-tokenizes the text
            kwargs.update(tokenizer=target.tokenizer, assistant_tokenizer=drafts[0].tokenizer)
    elif method == "hf-pld":
        kwargs["prompt_lookup_num_tokens"] = HF_PLD_TOKENS
    elif method == "hf-static":  # transformers' static cache; its generate compiles the forward on CUDA itself
        kwargs["cache_implementation"] = "static"
    return kwargs


def hf_runner(method: str, target, drafts, cfg: BenchConfig) -> Runner:
    """transformers' own ``generate`` as a baseline, timed around the whole call (prefill included, like ours)."""
    model = target.model
    kwargs = hf_kwargs(method, target, drafts, cfg)

    def run(ids: list[int], max_new_tokens: int) -> Generation:
        input_ids = torch.tensor([ids], device=model.device)
        counter = ForwardCounter(model)
        torch.manual_seed(cfg.settings.seed)
        try:
            t0 = time.perf_counter()
            with torch.inference_mode():
                out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids),
                                     max_new_tokens=max_new_tokens, **kwargs)
            seconds = time.perf_counter() - t0
        finally:
            counter.close()
        produced = [int(t) for t in out[0, len(ids):].tolist()]
        tokens = cut_at_stop(produced, target.stop_ids)
        return Generation(method, "", 0, tokens, seconds, forwards=counter.calls, emitted=len(produced))

    run.state = lambda: None  # transformers' generate learns nothing across calls
    run.load_state = lambda state: None
    return run
