"""``specdec`` command line: a thin layer over :mod:`specdec_cli.api`.

Every user-facing problem is a :class:`SpecdecError`, printed as one line on stderr with exit code 2.
"""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import sys
from contextlib import contextmanager
from typing import Iterator, List, Optional

import typer

from .errors import SpecdecError

app = typer.Typer(
    name="specdec",
    help="Training-free, lossless speculative decoding for Hugging Face causal LMs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def die(message: str, code: int = 2) -> None:
    """One line on stderr, then exit with ``code``."""
    sys.stderr.write(f"specdec: error: {' '.join(str(message).split())}\n")
    sys.stderr.flush()
    raise typer.Exit(code)


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn user-facing errors (and Ctrl-C) into one stderr line and a non-zero exit, never a traceback."""
    try:
        yield
    except SpecdecError as err:
        die(str(err), err.exit_code)
    except KeyboardInterrupt:
        die("interrupted", 130)
    except MemoryError:
        die("out of memory (try a smaller model, --dtype bfloat16, or fewer --max-new-tokens)", 1)


def quiet_libraries() -> None:
    """Keep transformers/torch chatter off the user's terminal; our own progress goes to stderr."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import warnings

    warnings.filterwarnings("ignore")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def parse_opts(opts: Optional[List[str]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in opts or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SpecdecError(f"--opt expects key=value, got {item!r}")
        out[key.strip().replace("-", "_")] = value.strip()
    return out


def read_prompts(prompt: Optional[str], batch_file: Optional[str]) -> list[str]:
    """The prompt argument, else one prompt per line of --batch-file ('-' = stdin), else all of stdin."""
    if prompt is not None and batch_file:
        raise SpecdecError("give either a prompt argument or --batch-file, not both")
    if prompt is not None:
        return [prompt]
    if batch_file:
        try:
            text = sys.stdin.read() if batch_file == "-" else open(batch_file, encoding="utf-8").read()
        except OSError as err:
            raise SpecdecError(f"cannot read --batch-file {batch_file}: {err.strerror}") from None
        prompts = [line for line in text.splitlines() if line.strip()]
        if not prompts:
            raise SpecdecError(f"--batch-file {batch_file} holds no prompts")
        return prompts
    if sys.stdin is None or sys.stdin.isatty():
        raise SpecdecError("no prompt: give one as an argument, pipe it on stdin, or use --batch-file")
    return [sys.stdin.read()]


class TextStreamer:
    """Prints decoded text as tokens arrive, re-decoding the tail so multi-token characters come out whole."""

    def __init__(self, tokenizer, out=sys.stdout):
        self.tokenizer, self.out = tokenizer, out
        self.tokens: list[int] = []
        self.printed = 0

    def __call__(self, new: list[int]) -> None:
        self.tokens.extend(new)
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        if text.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for the next token
            return
        self.out.write(text[self.printed:])
        self.out.flush()
        self.printed = len(text)

    def close(self) -> None:
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        self.out.write(text[self.printed:] + "\n")
        self.out.flush()


MODEL_HELP = "alias (smollm2-135m, gemma3-270m, codellama-7b, vicuna-7b, llama2-7b-chat, ...), hub id, or local path"
DRAFT_HELP = "draft model (repeat for hsddw: fast draft first, then the stronger one); also int8: / bf16: copies of the target"


@app.command()
def generate(
    prompt: Optional[str] = typer.Argument(None, help="prompt text; omitted: read stdin"),
    model: str = typer.Option("smollm2-135m", "--model", "-m", help=MODEL_HELP),
    method: str = typer.Option("ar", "--method", help="ar, sd, self-verify, hsddw, rest, aded, ngram-trie, pld"),
    draft: Optional[List[str]] = typer.Option(None, "--draft", "-d", help=DRAFT_HELP),
    draft1: Optional[str] = typer.Option(None, "--draft1", help="hsddw fast draft M1 (same as the first --draft)"),
    draft2: Optional[str] = typer.Option(None, "--draft2", help="hsddw stronger draft M2 (same as the second --draft)"),
    window: Optional[int] = typer.Option(None, "--window", "-k", help="draft window K (method default: sd 5, self-verify/hsddw 10)"),
    datastore: Optional[str] = typer.Option(None, "--datastore", help="datastore directory (rest, aded)"),
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
) -> None:
    """Generate text with speculative decoding; output is identical (greedy) or identically distributed to the target's own."""
    with user_errors():
        from . import api

        prompts = read_prompts(prompt, batch_file)
        drafts = list(draft or [])
        if draft1 or draft2:
            if drafts:
                raise SpecdecError("use either --draft (repeated) or --draft1/--draft2")
            drafts = [d for d in (draft1, draft2) if d]
        options = parse_opts(opt)
        if save_adapted:
            options["save_adapted"] = save_adapted
        sampling = api.SamplingConfig(temperature, top_p, top_k).validate()
        if method not in api.METHODS:
            raise SpecdecError(f"unknown method {method!r}; choose one of {', '.join(api.METHODS)}")
        if any(not p.strip() for p in prompts):
            raise SpecdecError("empty prompt: give a prompt argument, pipe text on stdin, or use --batch-file")
        from .bench import set_threads
        from .budget import parse_budget

        parse_budget(budget)
        set_threads(threads)
        quiet_libraries()
        target, draft_models = api.load(model, drafts, dtype, device, kernels)
        encoded = [api.encode_prompt(target, p, raw=raw, system=system, max_new_tokens=max_new_tokens) for p in prompts]
        drafter = api.make_drafter(method, target, draft_models, datastore=datastore, window=window, options=options,
                                   budget=budget)
        for i, ids in enumerate(encoded):
            streamer = None if as_json else TextStreamer(target.tokenizer)
            result = api.run(target, ids, drafter, max_new_tokens=max_new_tokens, sampling=sampling, seed=seed,
                             on_tokens=streamer)
            if streamer:
                streamer.close()
            else:
                record = {"index": i, "model": model, "method": method, "drafts": drafts,
                          "text": api.decode(target, result.tokens), "tokens": result.tokens, **result.summary(),
                          "steps": [vars(step) for step in result.steps]}
                print(json.dumps(record), flush=True)
        if hasattr(drafter, "save_adapted") and options.get("save_adapted"):
            drafter.save_adapted(options["save_adapted"])


@app.command("methods")
def list_methods() -> None:
    """List the decoding methods and what each needs."""
    from .methods import METHODS

    for name, info in METHODS.items():
        needs = ", ".join(filter(None, [f"{info.drafts} draft(s)" if info.drafts else "", "--datastore" if info.datastore else ""]))
        print(f"{name:12s} {info.help}" + (f"  [needs {needs}]" if needs else ""))


@app.command("models")
def list_models() -> None:
    """List the model aliases."""
    from .models import ALIASES

    for name, alias in ALIASES.items():
        print(f"{name:20s} {alias.hub_id or alias.pypi_gguf}  {alias.note}")


def _register_commands() -> None:
    from . import commands

    for mod in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{commands.__name__}.{mod.name}")
        if hasattr(module, "register"):
            module.register(app)


_register_commands()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
