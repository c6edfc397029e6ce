"""The flags several commands share, declared once (one name, one help text), and the choices they offer.

A command declares its parameters as ``model: str = options.MODEL``; the values are then checked once, where
they enter, by the typed objects of :mod:`specdec_cli.config` (``RunSettings``) and the registries (methods,
datastore kinds, prompt sets).
"""

from __future__ import annotations

from typing import List, Optional

import typer

from ..bench.baselines import OUTSIDE_BASELINES
from ..config import MAX_BATCH_FILE_BYTES, MAX_BATCH_SIZE, MAX_MEMORY_TOKENS
from ..io.aliases import ALIASES
from ..io.prompts import PROMPT_SETS
from ..methods import METHODS

MODEL_HELP = f"target model: alias ({', '.join(ALIASES)}), hub id or local path"
BUDGET_HELP = ("draft budget: auto (verify what pays off on this machine, measured), paper (each method's paper "
               "settings) or N (the N draft tokens most likely accepted)")
WINDOW_HELP = ("draft window K (default: the method's -- sd 16, or 5 with --budget paper; self-verify and hsddw 10; "
               "auto's draft model 8)")

MODEL = typer.Option("smollm2-135m", "--model", "-m", help=MODEL_HELP)
DRAFTS = typer.Option(None, "--draft", "-d", help="draft model, any tokenizer (repeat for hsddw: the fast draft "
                      "first, then the stronger one); int8: and bf16: are cheaper copies of the target")
WINDOW = typer.Option(None, "--window", "-k", help=WINDOW_HELP)
OPT = typer.Option(None, "--opt", help="method option key=value (repeatable; `specdec methods` lists them)")
MEMORY = typer.Option(None, "--memory", help="auto only: keep its memory of outputs in this folder across runs "
                      "(default: this run only, so runs are reproducible); runs may share a folder (saves are "
                      f"locked and merged); at most --opt memory_tokens tokens (up to {MAX_MEMORY_TOKENS:,})")
MAX_NEW_TOKENS = typer.Option(128, "--max-new-tokens", "-n", help="tokens to generate (per prompt and turn)")
TEMPERATURE = typer.Option(0.0, "--temperature", "-t", help="0 = greedy (output identical to ar's)")
SEED = typer.Option(0, "--seed", help="seed of the sampling (temperature > 0)")
DTYPE = typer.Option("auto", "--dtype", help="auto (float32 on CPU, bfloat16 on GPU), float32, bfloat16, float16")
DEVICE = typer.Option("auto", "--device", help="auto (device_map=auto over GPUs, else CPU), cpu, cuda, cuda:N")
THREADS = typer.Option(None, "--threads", help="torch CPU threads, from 1 to the CPUs this process may use "
                       "(default: torch's choice)")
BUDGET = typer.Option("auto", "--budget", help=BUDGET_HELP)
KERNELS = typer.Option("auto", "--kernels", help="CPU linear kernels of the target and of drafts that are models of "
                       "their own: auto (measured per row count, cached), exact (auto, but a 16-bit prompt's rows "
                       "are never rounded to 16 bits for a faster prefill: the float32 model with 16-bit weights, "
                       "bit for bit), blocks (auto, and a GGUF target's Q4_1/Q8_0 weights read as stored in its "
                       "decoding steps: the same float32 weights, a sixth of the bytes) or torch (PyTorch's own)")
COMPILE = typer.Option("auto", "--compile", help="static KV cache and compiled forwards (CUDA graphs on a GPU): auto "
                       "(on for CUDA, off on the CPU, where it measured slower), on, off, or static (the static cache "
                       "without compiling)")
BATCH_SIZE = typer.Option(1, "--batch-size", help="decode up to B prompts of --batch-file together (one target "
                          f"forward per step, docs/batching.md; B from 1 to {MAX_BATCH_SIZE}, at most one per prompt); "
                          "answers still come in input order")
BATCH_FILE_HELP = (f"one prompt per line ('-' = stdin; lines end at a newline only; at most "
                   f"{MAX_BATCH_FILE_BYTES >> 20} MB)")
BATCH_SIZES_HELP = (f"throughput mode: batch sizes (e.g. 1,4,8,16; each from 1 to {MAX_BATCH_SIZE}, and at most the "
                    "number of prompts); first turns, sequential ar and transformers' batched generate as baselines "
                    "(docs/bench.md)")
RAW = typer.Option(False, "--raw", help="do not apply the chat template")
ENGINE = typer.Option("specdec", "--engine", help="where the target runs: specdec (its own engine, every method) or "
                      "vllm (vLLM: methods vllm, vllm-ngram, vllm-suffix, auto = specdec's proposer; docs/vllm.md)")
TENSOR_PARALLEL = typer.Option(None, "--tensor-parallel-size", help="vLLM: GPUs the model is split over (tensor "
                               "parallel)")
PIPELINE_PARALLEL = typer.Option(None, "--pipeline-parallel-size", help="vLLM: pipeline stages (GPUs or nodes)")
EXECUTOR = typer.Option(None, "--distributed-executor-backend", help="vLLM: mp (processes on this machine) or ray "
                        "(a Ray cluster: several nodes)")
VLLM_ARG = typer.Option(None, "--vllm-arg", help="vLLM: any other LLM() argument as KEY=VALUE (VALUE read as JSON "
                        "when it is JSON), repeatable, e.g. --vllm-arg enforce_eager=true")
JSON = typer.Option(False, "--json", help="machine-readable output: JSON instead of text or a table")
PLOT = typer.Option(None, "--plot", help="write a PNG chart here")
METHOD_NAMES = ", ".join(METHODS)
BASELINE_NAMES = ", ".join(OUTSIDE_BASELINES)
PROMPT_SET_NAMES = ", ".join(PROMPT_SETS)

__all__ = ["List", "Optional"]  # re-exported for the commands' annotations
