"""The 16-bit strategies of the measured kernel plans (:mod:`specdec_cli.runtime.kernels`): bfloat16 and float16
weights kept as stored, float32 activations in and out.

A 16-bit target (``--dtype bfloat16|float16`` on the CPU) is, for specdec, the float32 model with every weight
rounded to 16 bits (a prompt's prefill excepted where it takes ``native``, below): the lean forward
(:mod:`specdec_cli.runtime.decoder`) keeps its activations, norms, rotary tables, attention and KV cache in
float32, and every linear layer computes ``x @ widen(W).T`` in float32. Its
strategies:

* ``d16x1``, ``d16x2`` -- :mod:`specdec_cli.runtime.tiles`' register tiles over one row or a pair of rows at a
  time (through :mod:`specdec_cli.runtime.dot16`'s entry points). Both give every row the same bits (the same
  fixed summation order), so the plan picks between them by speed alone and a verified row's result is a one-row
  forward's. Every forward of up to :data:`INVARIANT_ROWS` rows (decoding, verification, draft steps) takes one;
* ``widen`` -- only for longer forwards (prefills, where no row is compared with a one-row result): the weight
  widened to float32 a slice at a time (:data:`SLICE_BYTES`) and multiplied by MKL, which is compute-bound there;
* ``native`` -- the same forwards as ``widen``, on a CPU with a bfloat16 matrix unit: the rows rounded to
  bfloat16 and multiplied by PyTorch's own bfloat16 product (oneDNN; Intel's AMX-BF16 here), whose float32 sums
  are rounded to bfloat16 once and widened back. float16 always widens (its range would turn large rows to inf).
  It replaces ``widen`` where :func:`prefill_strategy` measures it :data:`NATIVE_GAIN` times faster.
  Only the prompt's keys and values see the rounded rows, and every method prefills alike, so every method still
  equals ``ar`` at the same dtype; how often the 16-bit output equals the float32 one is measured in
  docs/profiling.md ("16-bit prefills on the matrix unit").
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import numpy as np
import torch
import torch.nn.functional as F

from . import dot16
from .jit import COMPILED

FORMATS = {torch.bfloat16: "bf16", torch.float16: "fp16"} if COMPILED else {}
INVARIANT_ROWS = 64  # decoder.MAX_ROWS: every forward the engine compares rows of (see the module doc)
BLOCKED = {"d16x1": 1, "d16x2": 2}
STRATEGIES16 = (*BLOCKED, "widen", "native")
ANY_ORDER_ONLY = ("widen", "native")  # strategies whose rows need not match a one-row forward's bits
SLICE_BYTES = 8 << 20  # float32 weight rows widened at a time by "widen": a slice stays in this CPU's L3 (32 MB)
# "native" must beat "widen" by this much to replace it: with AMX-BF16 (docs/profiling.md) bfloat16 is 3.5-4.8x
# faster on SmolLM2's shapes; a CPU without a bfloat16 matrix unit gains far less, and so small a lead would not
# pay for rounding the rows to 16 bits (float16, 0.9-1.1x there, is never measured: prefill_strategy)
NATIVE_GAIN = 1.5
# (dtype, torch threads) -> prefill_strategy's measured choice, once per process: the two products split over
# threads differently (MKL's and oneDNN's), so one thread count's winner need not be another's
_PREFILL: dict[tuple[torch.dtype, int], str] = {}


_ANY_ORDER = [False]  # inside any_order(True): a forward whose rows no one compares (a prefill)


@contextmanager
def any_order(allowed: bool):
    """Let forwards of more than :data:`INVARIANT_ROWS` rows use ``widen`` or ``native`` (only a prompt's prefill,
    ``keep=0`` from an empty cache: a verification of a large tree, or tokens fed after a prefix, keep the
    row-invariant kernel whatever their size)."""
    previous, _ANY_ORDER[0] = _ANY_ORDER[0], allowed
    try:
        yield
    finally:
        _ANY_ORDER[0] = previous


def is_16bit(weight: torch.Tensor) -> bool:
    return weight.dtype in FORMATS and weight.device.type == "cpu"


def is_wide(model) -> bool:
    """Whether every linear layer of ``model`` runs these strategies (16-bit weights, float32 rows): then the
    model is the float32 one with 16-bit weights (:mod:`specdec_cli.runtime.decoder` runs it so)."""
    layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear) or hasattr(m, "_bits")]
    return bool(layers) and all(getattr(m, "_bits", None) is not None for m in layers)


def stored(weight: torch.Tensor) -> np.ndarray:
    """The weight's bits as a ``uint16`` numpy array (a view: no copy)."""
    return weight.detach().contiguous().view(torch.int16).numpy().view(np.uint16)


def apply16(strategy: str, x2: torch.Tensor, weight: torch.Tensor, bits: np.ndarray) -> torch.Tensor:
    """``x2 @ widen(weight).T`` in float32 (``x2``: contiguous float32 ``[n, in]``)."""
    if strategy in ANY_ORDER_ONLY and not _ANY_ORDER[0]:
        strategy = "d16x2"
    if strategy == "native":
        return F.linear(x2.to(weight.dtype), weight).float()
    block = BLOCKED.get(strategy)
    if block is not None:
        y = torch.empty((x2.shape[0], bits.shape[0]), dtype=torch.float32)
        dot16.KERNELS[FORMATS[weight.dtype]](x2.numpy(), bits, y.numpy(), block)
        return y
    rows = max(SLICE_BYTES // (4 * weight.shape[1]), 1)
    if rows >= weight.shape[0]:  # one slice: no concatenation (a copy of the whole output)
        return F.linear(x2, weight.float())
    return torch.cat([F.linear(x2, weight[i: i + rows].float()) for i in range(0, weight.shape[0], rows)], dim=1)


@torch.inference_mode()
def prefill_strategy(dtype: torch.dtype) -> str:
    """``native`` or ``widen``: the faster product of a bfloat16 prefill on this CPU (float16: ``widen``),
    measured once per process and thread count on one SmolLM2-sized product (256 rows, 1536x576: a millisecond or
    two either way, where PyTorch has no fast 16-bit product some tens of milliseconds)."""
    key = prefill_key(dtype)
    hit = _PREFILL.get(key)
    if hit is None and dtype != torch.bfloat16:  # float16 rows beyond 65504 would round to inf: float16 widens
        hit = _PREFILL[key] = "widen"
    if hit is None:
        gen = torch.Generator().manual_seed(0)
        x, w = torch.randn(256, 576, generator=gen), torch.randn(1536, 576, generator=gen).to(dtype)
        with any_order(True):  # oneDNN builds its kernel on the first call: _fastest's warm-up round
            best = _fastest(ANY_ORDER_ONLY, x, [w], [stored(w)], reps=2)
        hit = _PREFILL[key] = "native" if best["widen"] >= NATIVE_GAIN * best["native"] else "widen"
    return hit


def prefill_key(dtype: torch.dtype) -> tuple[torch.dtype, int]:
    """:data:`_PREFILL`'s key: the dtype at the thread count torch runs now."""
    return dtype, torch.get_num_threads()


def widen_prefills(model) -> None:
    """``--kernels exact``: every 16-bit linear layer of ``model`` widens its prefills (never ``native``), so the
    model is the float32 one with 16-bit weights bit for bit, the prompt's keys and values included."""
    for m in model.modules():
        if getattr(m, "_bits", None) is not None:
            m.wide = "widen"


def candidates(n: int) -> tuple[str, ...]:
    """The strategies timed for ``n`` rows: one row has one; a few rows, single rows or pairs; from four rows on,
    pairs (never slower there on the CPU of docs/profiling.md); beyond :data:`INVARIANT_ROWS` rows (prefills),
    ``widen`` alone: MKL's float32 product beat the pairs by 4-35% on every SmolLM2 shape at 256 and 780 rows
    (docs/profiling.md, "16-bit prefills"), and a plan that timed both at 256 rows picked the pairs on noise."""
    if n > INVARIANT_ROWS:
        return ("widen",)
    return ("d16x1",) if n == 1 else ("d16x1", "d16x2") if n < 4 else ("d16x2",)


@torch.inference_mode()
def tune_shape16(weights: list[torch.Tensor], buckets, tune_bytes: int, reps: int = 3) -> dict[int, str]:
    """bucket -> the fastest 16-bit strategy for these same-shape weights (timed round-robin as
    :func:`specdec_cli.runtime.kernels.tune_shape` times the float32 ones, on ``tune_bytes`` of weights)."""
    out_features, in_features = weights[0].shape
    per = weights[0].numel() * weights[0].element_size()
    if per > tune_bytes:  # one huge matrix (an LM head): slices of its rows, still far larger than any cache
        rows = max(tune_bytes // (4 * in_features * weights[0].element_size()), 1)
        weights = [weights[0][i * rows: (i + 1) * rows] for i in range(4)]
    else:
        weights = weights[: max(tune_bytes // per, 1)]
    bits = [stored(w) for w in weights]
    plan = {}
    for n in buckets:
        these = candidates(n)
        if len(these) == 1:
            plan[n] = these[0]
            continue
        x = torch.randn(n, in_features)
        subset = max(len(weights) // 4, 1) if n >= 16 else len(weights)  # compute-bound: a quarter is plenty
        best = _fastest(these, x, weights[:subset], bits[:subset], reps)
        plan[n] = min(best, key=best.get)
    return plan


def _fastest(strategies, x: torch.Tensor, weights: list[torch.Tensor], bits: list[np.ndarray],
             reps: int) -> dict[str, float]:
    """strategy -> the least seconds of ``reps`` rounds of ``x`` times every weight, timed round-robin (each round
    runs every strategy once, so a slower moment of the machine falls on all of them); one round first warms up."""
    best = {s: float("inf") for s in strategies}
    for rep in range(reps + 1):
        for s in strategies:
            t0 = time.perf_counter()
            for w, b in zip(weights, bits):
                apply16(s, x, w, b)
            if rep:
                best[s] = min(best[s], time.perf_counter() - t0)
    return best
