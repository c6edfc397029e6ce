"""``--engine vllm`` for ``generate`` and ``bench``: its flags checked once, before anything loads (one line and
exit 2 for an option this engine does not take), and ``generate``'s run on vLLM."""

from __future__ import annotations

import json
from typing import List, Optional

from ..config import BudgetSpec
from ..errors import SpecdecError

EXECUTORS = ("mp", "ray", "uni")  # vLLM's distributed_executor_backend values for one process group
PROPOSER_OPTIONS = ("context", "memory", "memory_dir", "memory_tokens")  # auto's --opt keys its proposer reads
RESERVED = ("model", "tokenizer", "speculative_config", "worker_extension_cls")  # set by specdec itself


def parse_vllm_args(items: Optional[List[str]]) -> dict:
    """``--vllm-arg KEY=VALUE``: VALUE as JSON when it parses (numbers, true/false, objects), else the string."""
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key.isidentifier():
            raise SpecdecError(f"--vllm-arg expects KEY=VALUE, got {item!r}")
        if key in RESERVED:
            raise SpecdecError(f"--vllm-arg {key}: specdec sets it (--model, --method)")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


def check_vllm_method(method: str, options: dict, datastore) -> None:
    """A method of --engine vllm; only specdec's proposer (auto) takes --datastore, --memory and --opt."""
    from ..serving.vllm_engine import check_method

    check_method(method)
    if method != "auto" and (options or datastore):
        given = "--datastore" if datastore else ("--memory" if "memory_dir" in options else "--opt")
        raise SpecdecError(f"{given} is an option of auto (specdec's proposer); {method} is vLLM's own")


def refuse_for_vllm(drafts, kernels: str, compile: str, budget: BudgetSpec, device: str, save_adapted=None) -> None:
    """Options of specdec's own engine that vLLM does not take."""
    given = [("--draft", bool(drafts)), ("--kernels", kernels != "auto"), ("--compile", compile != "auto"),
             ("--budget", not budget.adaptive), ("--device", device != "auto"), ("--save-adapted", bool(save_adapted))]
    why = {"--draft": "vLLM's drafters draft from token ids here; run draft models with --engine specdec",
           "--kernels": "vLLM runs its own kernels", "--compile": "vLLM compiles the model itself",
           "--budget": "specdec's proposer sizes each chain by what pays; --window K caps it",
           "--device": "vLLM places the model itself: --tensor-parallel-size, --distributed-executor-backend",
           "--save-adapted": "aded does not run on vLLM"}
    for flag, present in given:
        if present:
            raise SpecdecError(f"{flag} is not an option of --engine vllm ({why[flag]})")


def vllm_settings(engine: str, tensor_parallel_size: Optional[int], pipeline_parallel_size: Optional[int],
                  executor: Optional[str], vllm_args: Optional[List[str]], options: dict,
                  datastores: list[str]) -> dict:
    """vLLM's placement (passed through) and the proposer's settings, checked; ``{}`` on specdec's engine, where
    the vLLM flags are refused."""
    from ..config import ENGINES, positive

    if engine not in ENGINES:
        raise SpecdecError(f"unknown --engine {engine!r}; choose {', '.join(ENGINES)}")
    flags = {"--tensor-parallel-size": tensor_parallel_size, "--pipeline-parallel-size": pipeline_parallel_size,
             "--distributed-executor-backend": executor, "--vllm-arg": vllm_args or None}
    if engine != "vllm":
        given = [flag for flag, value in flags.items() if value is not None]
        if given:
            raise SpecdecError(f"{given[0]} is an option of --engine vllm")
        return {}
    from ..serving.vllm_engine import check_installed

    check_installed()
    positive(tensor_parallel_size, "--tensor-parallel-size")
    positive(pipeline_parallel_size, "--pipeline-parallel-size")
    if executor is not None and executor not in EXECUTORS:
        raise SpecdecError(f"--distributed-executor-backend must be one of {', '.join(EXECUTORS)}, got {executor!r}")
    other = sorted(set(options) - set(PROPOSER_OPTIONS))
    if other:
        raise SpecdecError(f"--opt {', '.join(other)} does not apply on --engine vllm (auto's proposer takes "
                           f"{', '.join(PROPOSER_OPTIONS)})")
    from ..methods import check_options

    check_options(["auto"], options)  # the values' types
    drafter = {"context": options.get("context", "1") != "0", "memory": options.get("memory", "1") != "0",
               "memory_dir": options.get("memory_dir") or None,
               "memory_tokens": int(options["memory_tokens"]) if "memory_tokens" in options else None,
               "datastores": [str(d) for d in datastores]}
    return {"tensor_parallel_size": tensor_parallel_size or 1, "pipeline_parallel_size": pipeline_parallel_size or 1,
            "executor": executor, "args": parse_vllm_args(vllm_args), "drafter": drafter}


def generate_on_vllm(model: str, method: str, prompts: list[str], settings, vllm: dict, *, dtype: str,
                     raw: bool, system: Optional[str], as_json: bool) -> None:
    """``specdec generate --engine vllm``: every prompt on one engine, at most ``settings.batch_size`` at once;
    answers printed in input order (streamed when there is one prompt and no --json)."""
    from .. import api
    from ..serving.vllm_engine import EngineOptions

    text = api.load_text(model)
    encoded = [api.encode_prompt(text, p, raw=raw, system=system, max_new_tokens=settings.max_new_tokens)
               for p in prompts]
    batch = min(settings.batch_size, len(encoded))
    longest = max(len(ids) for ids in encoded) + settings.max_new_tokens + (settings.window or 32) + 1
    opts = EngineOptions(dtype=dtype, threads=settings.threads, tensor_parallel_size=vllm["tensor_parallel_size"],
                         pipeline_parallel_size=vllm["pipeline_parallel_size"], executor=vllm["executor"],
                         window=settings.window, max_num_seqs=batch, seed=settings.seed, extra=vllm["args"],
                         drafter=vllm["drafter"], kv_tokens=batch * longest)
    engine = api.vllm_engine(method, text, opts)
    try:
        printer = Printer(api, text, {"model": model, "method": method, "engine": "vllm"}, as_json, len(encoded))
        engine.generate(encoded, settings.max_new_tokens, settings.sampling, on_result=printer.result,
                        on_tokens=printer.tokens if printer.streaming else None)
        printer.close(engine)
        engine.finish()
    finally:
        engine.close()


class Printer:
    """Answers in input order: streamed text, plain text separated by ``---``, or one JSON record each."""

    def __init__(self, api, text, meta: dict, as_json: bool, count: int):
        self.api, self.text, self.meta, self.as_json = api, text, meta, as_json
        self.streaming = count == 1 and not as_json
        self.ready: dict = {}
        self.next = 0
        self.streamer = None
        if self.streaming:
            from transformers import TextStreamer

            self.streamer = TextStreamer(text.tokenizer, skip_special_tokens=True)

    def tokens(self, index: int, new: list[int]) -> None:
        import torch

        kept = [t for t in new if t not in self.text.stop_ids]
        if kept:
            self.streamer.put(torch.tensor(kept))

    def result(self, index: int, result) -> None:
        self.ready[index] = result
        while self.next in self.ready:
            self.emit(self.next, self.ready.pop(self.next))
            self.next += 1

    def emit(self, index: int, result) -> None:
        if self.streaming:
            self.streamer.end()
            return
        answer = self.api.decode(self.text, result.tokens)
        if not self.as_json:
            print(("\n---\n\n" if index else "") + answer, flush=True)
            return
        n = len(result.tokens)
        print(json.dumps({"index": index, **self.meta, "text": answer, "tokens": result.tokens, "new_tokens": n,
                          "target_forwards": result.forwards, "emitted": result.emitted,
                          "accepted": result.emitted - result.forwards,
                          "mean_accepted_length": result.emitted / result.forwards if result.forwards else 0.0,
                          "total_s": result.seconds, "tokens_per_s": n / result.seconds if result.seconds else 0.0}),
              flush=True)

    def close(self, engine) -> None:
        """With --json, the proposer's statistics of the whole run (auto) as a last record."""
        if self.as_json and engine.method == "auto":
            print(json.dumps({"summary": True, **self.meta, "proposer": engine.stats()}), flush=True)
