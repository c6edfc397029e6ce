"""Bench baselines: decoders that are not specdec's (transformers' ``generate``, llama.cpp), timed in the same run
as specdec's methods. One entry each: its help text (``specdec bench --help``, the method checks) and where its
runner is made, as ``"module:function"`` in this package -- imported only when the baseline runs, so this table
(and ``--help``, and a bad method name) needs no torch. A runner factory is ``f(name, target, drafts, cfg) ->
Runner`` (:data:`specdec_cli.bench.config.Runner`).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Baseline:
    help: str
    runner: str  # "module:function" of specdec_cli.bench


OUTSIDE_BASELINES = {
    "hf": Baseline("transformers generate(), greedy", "hf:hf_runner"),
    "hf-assisted": Baseline("transformers generate(assistant_model=first --draft)", "hf:hf_runner"),
    "hf-pld": Baseline("transformers generate(prompt_lookup_num_tokens=10)", "hf:hf_runner"),
    "hf-static": Baseline("transformers generate(cache_implementation='static'), compiled by transformers where it "
                          "compiles", "hf:hf_runner"),
    "llama-cpp": Baseline("llama.cpp (llama-cpp-python), greedy, on a GGUF of the run's weights (F32, BF16 or F16 as "
                          "--dtype)", "llama_cpp:llama_cpp_runner"),
    "llama-cpp-f32": Baseline("llama.cpp on an F32 GGUF of the model", "llama_cpp:llama_cpp_runner"),
    "llama-cpp-f16": Baseline("llama.cpp on an F16 GGUF of the model", "llama_cpp:llama_cpp_runner"),
    "llama-cpp-bf16": Baseline("llama.cpp on a BF16 GGUF of the model", "llama_cpp:llama_cpp_runner"),
    "llama-cpp-stored": Baseline("llama.cpp on the GGUF file as it ships (quantized: 8-bit activations, another "
                                 "model)", "llama_cpp:llama_cpp_runner"),
}


def baseline_runner(name: str, target, drafts, cfg):
    """The runner of baseline ``name``, its module imported now."""
    module, function = OUTSIDE_BASELINES[name].runner.split(":")
    return getattr(importlib.import_module(f"{__package__}.{module}"), function)(name, target, drafts, cfg)
