"""The library API the CLI (and ``bench``) is a thin layer over.

    from specdec_cli import api
    target, drafts = api.load("smollm2-135m", drafts=["int8:"])
    settings = api.RunSettings(max_new_tokens=64)       # every value checked here, once
    ids = api.encode_prompt(target, "Write a haiku about caches.", max_new_tokens=settings.max_new_tokens)
    drafter = api.make_drafter("sd", target, drafts, settings)
    result = api.run(target, ids, drafter, settings)
    print(api.decode(target, result.tokens), result.summary())

``make_drafter``, ``run`` and ``run_batch`` also take the settings' fields as keywords (``max_new_tokens=64``),
checked the same way (:class:`~specdec_cli.config.RunSettings`); given with ``settings``, they override its fields
(``api.run(target, ids, drafter, settings, max_new_tokens=8)``: a short warm-up with the run's other values).
"""

from __future__ import annotations

import sys
from dataclasses import replace

from .runtime import profile
from .runtime import decoder, hugepages, kernels
from .runtime.dot import warm_up
from .runtime.kernels16 import widen_prefills
from .config import PAPER_BUDGET, BudgetSpec, RunSettings, SamplingConfig, check_placement
from .engine.budget import Budget
from .runtime.cache_mode import CacheMode, resolve
from .engine.loop import Drafter, GenerationResult, generate
from .engine.batch import generate_batch
from .engine.drafters import Drafters
from .errors import SpecdecError
from .methods import METHODS, MethodContext, build_drafter, check_options
from .io.models import LoadedModel, LoadedText, load_draft, load_model
from .io.models import load_text as _load_text

__all__ = ["load", "load_text", "encode_prompt", "make_drafter", "make_drafters", "run", "run_batch", "vllm_engine",
           "decode", "METHODS", "BudgetSpec", "RunSettings", "SamplingConfig", "SpecdecError"]


def note(message: str) -> None:
    """Progress for long one-time work, on stderr when it is a terminal (logs of piped runs stay clean)."""
    if sys.stderr is not None and sys.stderr.isatty():
        print(f"specdec: {message} ...", file=sys.stderr, flush=True)


def with_values(settings: RunSettings | None, values: dict) -> RunSettings:
    """``settings`` with the fields given as keywords replaced (checked again), else settings made of them."""
    if settings is None:
        return RunSettings(**values)
    return replace(settings, **values) if values else settings


def load(model: str, drafts: list[str] | tuple[str, ...] = (), dtype: str = "auto", device: str = "auto",
         kernel_mode: str = "auto") -> tuple[LoadedModel, list[LoadedModel]]:
    """The target and its drafts. ``kernel_mode="auto"`` swaps the float32 CPU linear layers of the target and of
    drafts that are models of their own for :mod:`specdec_cli.runtime.kernels`' measured ones (after the
    ``int8:``/``bf16:`` copies are made from the target); ``"exact"`` does too, but a 16-bit prefill keeps its rows
    in float32 (:func:`specdec_cli.runtime.kernels16.widen_prefills`); ``"blocks"`` does what ``"auto"`` does, and
    the target's layers read a GGUF file's quantized blocks in its decoding steps (:mod:`specdec_cli.runtime.blocks`);
    ``"torch"`` keeps PyTorch's."""
    check_placement(dtype, kernel_mode)
    tuned = kernel_mode != "torch"
    warming = warm_up() if tuned else None
    target = load_model(model, dtype, device)
    if tuned:  # before the drafts copy it and the kernels pack it: the weights in 2 MB pages (runtime/hugepages.py)
        target.info["hugepages_bytes"] = hugepages.adopt(target.model)
    loaded = [load_draft(d, target, dtype, device) for d in drafts]
    for draft in loaded:  # an int8:/bf16: copy of the target has fresh tensors, in 4 KB pages
        if draft.info.get("copy_of_target"):
            hugepages.forget(draft.model)
            draft.info.pop("hugepages_bytes", None)
    if warming is not None:
        warming.join()
    if kernel_mode == "blocks":
        target.info["blocks"] = attach_blocks(target)
    if tuned:
        target.info["kernels"] = kernels.install(target.model, progress=note)
        for draft in loaded:  # a draft model of its own (not a copy of the target) is a float model like it
            if not draft.info.get("copy_of_target"):
                draft.info["hugepages_bytes"] = hugepages.adopt(draft.model)
                draft.info["kernels"] = kernels.install(draft.model, progress=note)
        if kernel_mode == "exact":
            for m in (target, *loaded):
                widen_prefills(m.model)
    else:  # PyTorch's kernels and transformers' own module code, as they come
        for m in (target, *loaded):
            decoder.disable(m.model)
    return target, loaded


def attach_blocks(target: LoadedModel) -> dict:
    """``--kernels blocks``: the quantized blocks of the GGUF file ``target`` was converted from, read into its
    float32 CPU layers whose weights they give bit for bit (:func:`specdec_cli.runtime.blocks.attach`)."""
    from .io.gguf import source_gguf
    from .runtime import blocks

    path = source_gguf(target.info["source"])
    if path is None:
        raise SpecdecError(f"--kernels blocks reads a GGUF file's blocks, and model {target.name!r} was not "
                           "converted from one")
    summary = blocks.attach(target.model, path)
    if not summary["layers"]:
        why = (f"{len(summary['mismatched'])} layer(s) in those formats did not give the model's float32 weights "
               "(a 16-bit or GPU model?)" if summary["mismatched"] else f"none is in {', '.join(blocks.FORMATS)}")
        raise SpecdecError(f"--kernels blocks reads the blocks of {path.name} into float32 CPU layers: {why}")
    return summary


def encode_prompt(target: LoadedModel, text: str, *, raw: bool = False, system: str | None = None,
                  max_new_tokens: int = 0, history: list[dict] | None = None) -> list[int]:
    """Token ids for ``text``: the chat template is applied for chat models unless ``raw``.

    ``history`` (earlier ``{"role", "content"}`` turns) allows multi-turn prompts such as MT-Bench's second turn.
    Raises :class:`SpecdecError` for an empty prompt or one that leaves no room in the model's context.
    """
    if not text or not text.strip():
        raise SpecdecError("empty prompt: give a prompt argument, pipe text on stdin, or use --batch-file")
    tok = target.tokenizer
    if target.chat and not raw and getattr(tok, "chat_template", None):
        messages = ([{"role": "system", "content": system}] if system else []) + list(history or [])
        messages.append({"role": "user", "content": text})
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if not isinstance(ids, list):
            ids = ids["input_ids"]
    else:
        ids = tok(text, add_special_tokens=True)["input_ids"]
    ids = [int(i) for i in ids]
    limit = target.context_length
    if max_new_tokens >= limit:
        raise SpecdecError(f"--max-new-tokens {max_new_tokens} does not fit in the model's context of {limit} tokens "
                           f"(with this {len(ids)}-token prompt: at most {max(limit - len(ids), 0)})")
    if len(ids) + max_new_tokens > limit:
        raise SpecdecError(
            f"prompt is too long: {len(ids)} tokens + {max_new_tokens} new tokens exceed the model's context of {limit}")
    return ids


def make_drafter(method: str, target: LoadedModel, drafts: list[LoadedModel] = (), settings: RunSettings | None = None,
                 *, datastore: str | list[str] | None = None, options: dict[str, str] | None = None,
                 check: bool = True, compile: str | CacheMode = "auto", opened: dict | None = None,
                 shared: dict | None = None, **values) -> Drafter:
    """A drafter for ``method`` with its :class:`~specdec_cli.engine.budget.Budget` (``settings.budget``;
    ``auto``: priced with this machine's measured forward times of ``target``, measured once and cached).
    ``settings``: the run's checked values, else made from ``values`` (``window=``, ``budget=``, ...).
    ``datastore``: a folder, or for ``auto`` a list of folders of any kinds. ``check=False``: the caller has checked
    ``options`` against several methods that share them (bench). ``opened``: the stores the pre-check opened
    (:func:`specdec_cli.methods.precheck_datastore`), used instead of opening them again. ``shared``: the parts the
    drafters of one batch hold once (:func:`make_drafters`; ``MethodContext.held_once``). ``compile``: ``--compile``
    (auto, on, off, static) or a resolved :class:`~specdec_cli.runtime.cache_mode.CacheMode`, resolved here once:
    the drafter keeps it (``drafter.cache_mode``) and :func:`run` generates on that path."""
    settings = with_values(settings, values)
    mode = settings.budget
    stores = [datastore] if isinstance(datastore, str) else list(datastore or [])
    if method != "auto" and len(stores) > 1:
        raise SpecdecError(f"--method {method} takes one --datastore, got {len(stores)} (only auto takes several)")
    ctx = MethodContext(target, list(drafts), None if method == "auto" else (stores or [None])[0], settings.window,
                        dict(options or {}), mode, datastores=stores if method == "auto" else [],
                        opened=opened if opened is not None else {}, shared=shared if shared is not None else {})
    if check:
        check_options([method], ctx.options)
    drafter = build_drafter(method, ctx)
    if method == "ar":  # nothing to select or gate
        mode = PAPER_BUDGET
    cache_mode = resolve(compile, target.model)  # the budget prices drafts with the forward times of this path
    times = profile.profile_for(target.model, progress=note, cache_mode=cache_mode,  # a greedy run's own path
                                greedy=settings.sampling.greedy) if mode.adaptive else None
    drafter.budget = Budget(mode, times, gate=drafter.gated_by_budget, trust_scores=drafter.calibrated_scores,
                            cheap_probe=not drafter.probe_prefills)
    drafter.cache_mode = cache_mode
    return drafter


def run(target: LoadedModel, prompt_ids: list[int], drafter: Drafter, settings: RunSettings | None = None, *,
        on_tokens=None, compile: str | CacheMode | None = None, **values) -> GenerationResult:
    """One generation. ``settings``: the run's checked values, else made from ``values`` (``max_new_tokens=``,
    ``sampling=``, ``seed=``). ``compile``: None (default) runs on the path the drafter was made for
    (:func:`make_drafter`'s ``compile``; ``auto`` for a drafter made elsewhere); a value (auto, on, off, static, or
    a :class:`~specdec_cli.runtime.cache_mode.CacheMode`) overrides it."""
    settings = with_values(settings, values)
    chosen = drafter.cache_mode if compile is None else compile
    cache_mode = resolve("auto" if chosen is None else chosen, target.model)
    return generate(target.model, prompt_ids, drafter, max_new_tokens=settings.max_new_tokens,
                    sampling=settings.sampling, seed=settings.seed, stop_ids=target.stop_ids, on_tokens=on_tokens,
                    cache_mode=cache_mode)


def make_drafters(method: str, target: LoadedModel, drafts: list[LoadedModel] = (), settings: RunSettings | None = None,
                  *, datastore: str | list[str] | None = None, options: dict[str, str] | None = None,
                  check: bool = True, compile: str | CacheMode = "auto", opened: dict | None = None,
                  **values) -> Drafters:
    """The drafter of a batched run (:func:`run_batch`): one :class:`~specdec_cli.engine.drafters.Drafters` with
    ``settings.batch_size`` slots, each made like :func:`make_drafter` (``batch_size=4`` among ``values``
    overrides the settings'), sequences keyed by id. A slot holds one sequence's state at a time; what the method
    learns about the run's outputs (``auto``'s memory and calibration, ``aded``'s adapted matrix) and the opened
    stores are made once, by the first slot, and held by every slot. Call its ``finish()`` after the last run
    (the first slot saves the memory and the matrix then, after the others). Its slots read as the list this
    returned before did for reading: ``len``, indexing, iteration, ``reversed`` (not ``append`` nor ``+``)."""
    if "count" in values:  # its name before settings.batch_size (kept for callers of the earlier API)
        values["batch_size"] = values.pop("count")
    settings = with_values(settings, values)
    kwargs = {"datastore": datastore, "options": options, "check": check, "compile": compile,
              "opened": {} if opened is None else opened,  # one open per datastore, shared by the slots
              "shared": {}}  # one memory / adapted matrix for the batch
    return Drafters([make_drafter(method, target, drafts, settings, **kwargs) for _ in range(settings.batch_size)])


def run_batch(target: LoadedModel, prompts: list[list[int]], drafters: Drafters | list[Drafter],
              settings: RunSettings | None = None, *, on_result=None, on_step=None, **values) -> list[GenerationResult]:
    """Every prompt, up to ``len(drafters)`` decoding together (:mod:`specdec_cli.engine.batch`): one target forward
    per step for the whole batch. ``on_result(index, result)`` as each prompt finishes; results in input order."""
    settings = with_values(settings, values)
    if not prompts:
        return []
    drafters = Drafters.of(drafters)
    times, rows = None, min(len(drafters), len(prompts))
    if drafters.slots[0].budget.mode.adaptive and rows > 1:  # priced with measured batch forwards (one row
        from .runtime.batch_profile import batch_times_for  # decodes in its one-sequence cache: its own profile)

        # sampled: timed on SDPA, the path its rows take (a greedy batch also corrects its table as it runs)
        times = batch_times_for(target.model, rows, progress=note, exact=not settings.sampling.greedy)
    return generate_batch(target.model, prompts, drafters, max_new_tokens=settings.max_new_tokens,
                          sampling=settings.sampling, seed=settings.seed, stop_ids=target.stop_ids,
                          on_result=on_result, on_step=on_step, times=times)


def load_text(model: str) -> LoadedText:
    """``model``'s tokenizer, chat flag, context and stop ids without its weights (for an engine that loads them
    itself): :func:`encode_prompt` and :func:`decode` take it like a :class:`LoadedModel`."""
    return _load_text(model)


def vllm_engine(method: str, text: LoadedText, options=None):
    """A started vLLM engine running ``method`` (``vllm``, ``vllm-ngram``, ``vllm-suffix``, or ``auto``: specdec's
    proposer) for the model of ``text`` (:func:`load_text`), with ``options`` (placement passed through to vLLM:
    :class:`~specdec_cli.serving.vllm_engine.EngineOptions`). ``engine.generate(prompts, max_new_tokens,
    sampling)``; ``engine.stats()``; ``engine.close()``."""
    from .serving.vllm_engine import EngineOptions, VllmEngine, check_installed

    check_installed()
    engine = VllmEngine(method, text.info["source"], text, options or EngineOptions())
    engine.start()
    return engine


def decode(target: LoadedModel, tokens: list[int]) -> str:
    return target.tokenizer.decode(tokens, skip_special_tokens=True)
