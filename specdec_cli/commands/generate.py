"""``specdec generate``: one prompt, a batch file or stdin, streamed as text or as JSON records."""

from __future__ import annotations

import json
from typing import List, Optional

import typer

from ..errors import SpecdecError
from . import options as flags
from .common import parse_opts, quiet_libraries, read_prompts, user_errors
from .on_vllm import check_vllm_method, generate_on_vllm, refuse_for_vllm, vllm_settings


def register(app: typer.Typer) -> None:
    app.command("generate")(generate)


def generate(
    prompt: Optional[str] = typer.Argument(None, help="prompt text; omitted: read stdin"),
    model: str = flags.MODEL,
    method: str = typer.Option("auto", "--method", help=f"{flags.METHOD_NAMES} (auto, the default: every draft "
                               "source at once)"),
    draft: Optional[List[str]] = flags.DRAFTS,
    window: Optional[int] = flags.WINDOW,
    datastore: Optional[List[str]] = typer.Option(None, "--datastore", help="datastore directory (rest, aded; auto "
                                                  "takes several, of any kind)"),
    memory: Optional[str] = flags.MEMORY,
    opt: Optional[List[str]] = flags.OPT,
    save_adapted: Optional[str] = typer.Option(None, "--save-adapted", help="aded: save the adapted tri-gram matrix here"),
    max_new_tokens: int = flags.MAX_NEW_TOKENS,
    temperature: float = flags.TEMPERATURE,
    top_p: float = typer.Option(1.0, "--top-p"),
    top_k: int = typer.Option(0, "--top-k", help="0 = off"),
    seed: int = flags.SEED,
    dtype: str = flags.DTYPE,
    device: str = flags.DEVICE,
    raw: bool = flags.RAW,
    system: Optional[str] = typer.Option(None, "--system", help="system message for chat models"),
    batch_file: Optional[str] = typer.Option(None, "--batch-file", help=flags.BATCH_FILE_HELP),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object per prompt (text + statistics)"),
    budget: str = flags.BUDGET,
    kernels: str = flags.KERNELS,
    threads: Optional[int] = flags.THREADS,
    compile: str = flags.COMPILE,
    batch_size: int = flags.BATCH_SIZE,
    engine: str = flags.ENGINE,
    tensor_parallel_size: Optional[int] = flags.TENSOR_PARALLEL,
    pipeline_parallel_size: Optional[int] = flags.PIPELINE_PARALLEL,
    distributed_executor_backend: Optional[str] = flags.EXECUTOR,
    vllm_arg: Optional[List[str]] = flags.VLLM_ARG,
) -> None:
    """Generate text with speculative decoding; output is identical (greedy) or identically distributed to the target's own."""
    with user_errors():
        from ..config import RunSettings, SamplingConfig, check_placement

        check_placement(dtype, kernels)  # before the prompts are read and torch is imported
        prompts = read_prompts(prompt, batch_file)
        settings = RunSettings(max_new_tokens, SamplingConfig(temperature, top_p, top_k), seed, window, budget, threads,
                               batch_size)  # every value checked here, once
        options, stores = method_options(opt, save_adapted, memory, method), list(datastore or [])
        vllm = vllm_settings(engine, tensor_parallel_size, pipeline_parallel_size, distributed_executor_backend,
                             vllm_arg, options, stores)
        if vllm:
            check_vllm_method(method, options, stores)
            refuse_for_vllm(draft, kernels, compile, settings.budget, device, save_adapted)
            settings = check_prompts(prompts, settings)
            open_stores("auto", stores, model)
            return generate_on_vllm(model, method, prompts, settings, vllm, dtype=dtype, raw=raw, system=system,
                                    as_json=as_json)
        on_specdec(model, method, prompts, settings, options, stores, list(draft or []), (dtype, device, kernels),
                   compile, (raw, system, as_json))


def on_specdec(model: str, method: str, prompts: list[str], settings, options: dict, stores: list[str],
               drafts: list[str], placement: tuple, compile: str, output: tuple) -> None:
    """``generate`` on specdec's own engine: every cheap check, then the model, then the answers."""
    from ..methods import check_methods, check_options
    from ..runtime.cache_mode import check as check_compile

    (dtype, device, kernels), (raw, system, as_json) = placement, output
    check_methods([method])
    check_compile(compile)
    settings = check_prompts(prompts, settings)
    check_options([method], options)
    opened = open_stores(method, stores, model)
    from .. import api
    from ..runtime.machine import set_threads

    set_threads(settings.threads)
    target, draft_models = api.load(model, drafts, dtype, device, kernels)
    encoded = [api.encode_prompt(target, p, raw=raw, system=system, max_new_tokens=settings.max_new_tokens)
               for p in prompts]
    meta = {"model": model, "method": method, "drafts": drafts}
    if settings.batch_size > 1:  # several prompts (check_prompts leaves at most one slot per prompt)
        drafters = api.make_drafters(method, target, draft_models, settings, datastore=stores, options=options,
                                     compile=compile, opened=opened, check=False)
        return answer_batch(api, target, encoded, drafters, settings, {**meta, "batch_size": settings.batch_size},
                            as_json)
    drafter = api.make_drafter(method, target, draft_models, settings, datastore=stores, options=options,
                               compile=compile, opened=opened, check=False)  # options checked above
    for i, ids in enumerate(encoded):
        answer(api, target, ids, drafter, settings, i, meta if as_json else None)
    drafter.finish()


def check_prompts(prompts: list[str], settings):
    """The prompts are not empty; returns ``settings`` with the batch size to use: ``--batch-size`` (checked when
    the settings were made), at most one slot per prompt."""
    from dataclasses import replace

    if any(not p.strip() for p in prompts):
        raise SpecdecError("empty prompt: give a prompt argument, pipe text on stdin, or use --batch-file")
    return replace(settings, batch_size=min(settings.batch_size, len(prompts)))


def open_stores(method: str, stores: list[str], model: str) -> dict:
    """Each --datastore opened once (handed to the method), of the method's kind and of the model's tokenizer --
    said before the weights load (the tokenizer alone is cheap)."""
    from ..methods import precheck_datastore

    opened = precheck_datastore(method, stores)
    quiet_libraries()
    if stores:
        from ..datastore import check_stores_tokenizer

        check_stores_tokenizer(stores, model)
    return opened


def method_options(opt: Optional[List[str]], save_adapted: Optional[str], memory: Optional[str],
                   method: str) -> dict[str, str]:
    """``--opt`` values, with ``--save-adapted`` (aded) and ``--memory`` (auto) as the options they are: the
    other methods refuse them."""
    options = parse_opts(opt)
    if save_adapted:
        options["save_adapted"] = save_adapted
    if memory:
        from ..drafting.output_memory import check_folder

        if method != "auto":
            raise SpecdecError(f"--memory is an option of auto only (its memory of earlier outputs); drop it, or "
                               f"use --method auto instead of {method}")
        check_folder(memory)
        options["memory_dir"] = memory
    return options


def answer(api, target, ids: list[int], drafter, settings, index: int, meta: dict | None) -> None:
    """One prompt's answer: streamed as text (answers of a batch told apart by ``---``), or one JSON record."""
    if meta is None:
        import torch

        if index:
            print("\n---\n", flush=True)
        streamer = text_streamer(target.tokenizer)
        api.run(target, ids, drafter, settings,
                on_tokens=lambda new: streamer.put(torch.tensor(new)))
        streamer.end()
        return
    result = api.run(target, ids, drafter, settings)  # on the path make_drafter resolved --compile to
    record = {"index": index, **meta, "text": api.decode(target, result.tokens), "tokens": result.tokens,
              **result.summary(), "steps": [vars(step) for step in result.steps]}
    print(json.dumps(record), flush=True)


def answer_batch(api, target, encoded: list[list[int]], drafters, settings, meta: dict, as_json: bool) -> None:
    """Every prompt decoded in batches; each answer printed as soon as it and every answer before it are done."""
    ready: dict = {}
    order = iter(range(len(encoded)))
    nxt = [next(order)]

    def emit(index: int, result) -> None:
        text = api.decode(target, result.tokens)
        if as_json:
            record = {"index": index, **meta, "text": text, "tokens": result.tokens, **result.summary(),
                      "steps": [vars(step) for step in result.steps]}
            print(json.dumps(record), flush=True)
        else:
            print(("\n---\n\n" if index else "") + text, flush=True)

    def on_result(index: int, result) -> None:
        ready[index] = result
        while nxt[0] in ready:
            emit(nxt[0], ready.pop(nxt[0]))
            nxt[0] = next(order, -1)

    api.run_batch(target, encoded, drafters, settings, on_result=on_result)
    drafters.finish()  # the first slot saves auto's --memory, after the others have added to it


def text_streamer(tokenizer):
    """transformers' own streamer: prints whole words as tokens arrive (our loop hands it each step's tokens)."""
    from transformers import TextStreamer

    return TextStreamer(tokenizer, skip_special_tokens=True)
