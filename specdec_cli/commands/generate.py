"""``specdec generate``: one prompt, a batch file or stdin, streamed as text or as JSON records."""

from __future__ import annotations

import json
from typing import List, Optional

import typer

from ..errors import SpecdecError
from .common import (COMPILE_HELP, check_compile, check_generation_args, parse_opts, quiet_libraries, read_prompts, user_errors)


def register(app: typer.Typer) -> None:
    app.command("generate")(generate)


MODEL_HELP = "alias (smollm2-135m, gemma3-270m, codellama-7b, vicuna-7b, llama2-7b-chat, ...), hub id, or local path"
DRAFT_HELP = "draft model (repeat for hsddw: fast draft first, then the stronger one); also int8: / bf16: copies of the target"


def generate(
    prompt: Optional[str] = typer.Argument(None, help="prompt text; omitted: read stdin"),
    model: str = typer.Option("smollm2-135m", "--model", "-m", help=MODEL_HELP),
    method: str = typer.Option("auto", "--method", help="auto (default: every draft source at once), ar, sd, "
                               "self-verify, hsddw, rest, aded, ngram-trie, pld"),
    draft: Optional[List[str]] = typer.Option(None, "--draft", "-d", help=DRAFT_HELP),
    window: Optional[int] = typer.Option(None, "--window", "-k", help="draft window K (method default: sd 5, self-verify/hsddw 10)"),
    datastore: Optional[List[str]] = typer.Option(None, "--datastore", help="datastore directory (rest, aded; auto "
                                                  "takes several, of any kind)"),
    memory: Optional[str] = typer.Option(None, "--memory", help="auto: keep the memory of outputs in this folder "
                                         "across runs (default: this run only)"),
    opt: Optional[List[str]] = typer.Option(None, "--opt", help="method option key=value (repeatable), see docs/"),
    save_adapted: Optional[str] = typer.Option(None, "--save-adapted", help="aded: save the adapted tri-gram matrix here"),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens", "-n"),
    temperature: float = typer.Option(0.0, "--temperature", "-t", help="0 = greedy"),
    top_p: float = typer.Option(1.0, "--top-p"),
    top_k: int = typer.Option(0, "--top-k", help="0 = off"),
    seed: int = typer.Option(0, "--seed"),
    dtype: str = typer.Option("auto", "--dtype", help="auto (float32 on CPU, bfloat16 on GPU), float32, bfloat16, float16"),
    device: str = typer.Option("auto", "--device", help="auto (device_map=auto over GPUs, else CPU), cpu, cuda, cuda:N"),
    raw: bool = typer.Option(False, "--raw", help="do not apply the chat template"),
    system: Optional[str] = typer.Option(None, "--system", help="system message for chat models"),
    batch_file: Optional[str] = typer.Option(None, "--batch-file", help="one prompt per line ('-' = stdin)"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object per prompt (text + statistics)"),
    budget: str = typer.Option("auto", "--budget", help="draft budget: auto (what pays off on this machine), "
                               "paper (the method's paper settings) or N (the N draft tokens most likely accepted)"),
    kernels: str = typer.Option("auto", "--kernels", help="CPU linear kernels: auto (measured, cached) or torch"),
    threads: Optional[int] = typer.Option(None, "--threads", help="torch CPU threads (default: torch's choice)"),
    compile: str = typer.Option("auto", "--compile", help=COMPILE_HELP),
) -> None:
    """Generate text with speculative decoding; output is identical (greedy) or identically distributed to the target's own."""
    with user_errors():
        from ..methods import METHODS, check_options, precheck_datastore
        from ..config import SamplingConfig, parse_budget

        prompts = read_prompts(prompt, batch_file)
        drafts = list(draft or [])
        options = parse_opts(opt)
        if save_adapted:
            options["save_adapted"] = save_adapted  # an aded option: refused for the other methods
        if memory:
            from ..drafting.output_memory import check_folder

            check_folder(memory)
            options["memory_dir"] = memory  # an auto option: refused for the other methods
        check_generation_args(max_new_tokens, window)
        check_compile(compile)
        sampling = SamplingConfig(temperature, top_p, top_k).validate()
        if method not in METHODS:
            raise SpecdecError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
        if any(not p.strip() for p in prompts):
            raise SpecdecError("empty prompt: give a prompt argument, pipe text on stdin, or use --batch-file")
        check_options([method], options)
        parse_budget(budget)
        if threads is not None and threads < 1:
            raise SpecdecError(f"--threads must be >= 1, got {threads}")
        stores = list(datastore or [])
        opened = precheck_datastore(method, stores)  # each store opened once, handed to the method
        quiet_libraries()
        if stores:  # a store of another tokenizer: said before the weights load (the tokenizer alone is cheap)
            from ..datastore import check_stores_tokenizer

            check_stores_tokenizer(stores, model)
        import torch

        from .. import api
        from ..runtime.machine import set_threads

        set_threads(threads)
        target, draft_models = api.load(model, drafts, dtype, device, kernels)
        encoded = [api.encode_prompt(target, p, raw=raw, system=system, max_new_tokens=max_new_tokens) for p in prompts]
        drafter = api.make_drafter(method, target, draft_models, datastore=stores, window=window, options=options,
                                   budget=budget, compile=compile, opened=opened)
        for i, ids in enumerate(encoded):
            if i and not as_json:
                print("\n---\n", flush=True)  # plain-text answers of a batch, told apart
            streamer = None if as_json else text_streamer(target.tokenizer)
            result = api.run(target, ids, drafter, max_new_tokens=max_new_tokens, sampling=sampling, seed=seed,
                             compile=compile,
                             on_tokens=streamer and (lambda new: streamer.put(torch.tensor(new))))  # noqa: B023
            if streamer:
                streamer.end()
            else:
                record = {"index": i, "model": model, "method": method, "drafts": drafts,
                          "text": api.decode(target, result.tokens), "tokens": result.tokens, **result.summary(),
                          "steps": [vars(step) for step in result.steps]}
                print(json.dumps(record), flush=True)
        drafter.finish()


def text_streamer(tokenizer):
    """transformers' own streamer: prints whole words as tokens arrive (our loop hands it each step's tokens)."""
    from transformers import TextStreamer

    return TextStreamer(tokenizer, skip_special_tokens=True)
