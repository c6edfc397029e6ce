"""CPU linear layers that pick, per number of rows, the fastest of a few float32 formulations of ``x @ W.T``.

Why (docs/profiling.md): a CPU decoding step pushes a handful of rows through every weight matrix, and PyTorch's
one formulation (``F.linear``: MKL ``sgemm``, B transposed) is far from the memory bound for such shapes. On the
2-core EPYC of docs/benchmarks.md, one thread, Gemma-3-270M's 262,144 x 640 LM head took 57 ms for 1 row, 128 for 2,
186 for 3; the same products took 29 ms (1 row, transposed copy), 33 (2 rows, ``W @ x.T``) and 48 (3 rows).

:class:`FastLinear` replaces an ``nn.Linear`` (sharing its weight ``Parameter``, so tied weights stay tied) and
dispatches on the row count through a *plan* measured once per machine, thread count and weight shape
(:func:`tune`, cached under ``$SPECDEC_CACHE/kernels``):

* ``nt``     -- ``F.linear(x, W)``, PyTorch's own path (also the fallback);
* ``tn``     -- ``(W @ x.T).T``: the same product, with MKL choosing another kernel;
* ``wt``     -- ``x @ W_t`` with a contiguous transposed copy ``W_t`` (extra memory);
* ``mkldnn`` -- oneDNN's product on a copy of ``W`` packed for it (extra memory);
* ``dot``    -- register tiles of 2 rows x 4 outputs (:mod:`specdec_cli.runtime.tiles`, numba), reading ``W`` as
  it is: each weight vector loaded serves two rows (on AVX-512 four or eight), each input vector four outputs.
  Single-threaded MKL's GEMV streams a 576-wide weight at ~11 GB/s on the EPYC of docs/profiling.md, the tiles at
  the read bandwidth; for 4-8 rows MKL's GEMM took 1.9-3.5x one row's time, the tiles take 1.2-1.6x. Each output's
  sum runs in one order whatever the row count: a verified row's logits are a one-row forward's (while every row
  count up to it uses ``dot``), split over threads on numba's OpenMP pool. ``blocks``: ``dot``'s tiles reading a
  GGUF file's blocks (:mod:`specdec_cli.runtime.blocks`).

16-bit weights (``--dtype bfloat16|float16``) get :mod:`specdec_cli.runtime.kernels16`'s row-invariant strategies
instead (the weight read as stored, float32 rows in and out), in plans keyed by the weight's dtype.

All compute the float32 product (only the summation order differs, as between PyTorch's own kernels for
different row counts). Copies are kept only where the plan uses them and while they fit in
:data:`EXTRA_MEMORY_FRACTION` of the available memory. The fast path runs only inside :func:`active` (the engine's
forwards): anything else calling the model (transformers' own ``generate`` in ``specdec bench``) runs the stock layers.
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn.functional as F

from ..io.atomic import write_cache
from ..io.jsonl import read_json
from . import blocks
from .jit import COMPILED
from .kernels16 import FORMATS, apply16, is_16bit, prefill_strategy, stored, tune_shape16
from .machine import available_bytes, setup_key
from .products import COPIES, PACKED, STRATEGIES
from .products import apply as _apply, dot as _dot, pack as _pack  # _dot: a global the step profiler wraps

BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 256)  # 256: prefills (every n > 64)
WIDE = 64  # above this many rows the product is compute-bound: timed on fewer weights, copy-free "tn" skipped
DOT_ROWS = WIDE  # "dot" is timed for every forward whose rows are compared (prefills are MKL's: compute-bound)
PLAN_VERSION = 9  # 9: float32 tall tiles, dot split on OpenMP's pool; 8: keyed by OpenMP's waits; ...
TUNE_BYTES = 64 << 20  # weights streamed per timing: enough to fall out of the caches, as in a real forward
SWITCH_MARGIN = 0.95  # another strategy must be >= 5% faster than nt to be used (timings are noisy)
EXTRA_MEMORY_FRACTION = 0.3

_ACTIVE = False  # inside active(): the engine's forwards
SWAPS = "_specdec_kernel_swaps"  # a model attribute counting installs (runtime.decoder re-reads the layers)


@contextmanager
def active():
    """Run the fast path of every :class:`FastLinear` inside this block (re-entrant)."""
    global _ACTIVE
    previous, _ACTIVE = _ACTIVE, True
    try:
        yield
    finally:
        _ACTIVE = previous


def bucket_of(n: int) -> int:
    """The plan entry that serves ``n`` rows: the smallest bucket >= n (the last one beyond it)."""
    for b in BUCKETS:
        if n <= b:
            return b
    return BUCKETS[-1]


class FastLinear(torch.nn.Module):
    def __init__(self, linear: torch.nn.Linear, plan: dict[int, str]):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        self.plan = {n: ("nt" if s == "dot" and not COMPILED else s) for n, s in plan.items()}  # no numba here
        # 16-bit weights: float32 rows through kernels16 (``_bits``: the weight's bits as uint16, no copy)
        self._bits = stored(self.weight) if is_16bit(self.weight) else None
        self.table = [self.plan.get(bucket_of(n), "nt") for n in range(WIDE + 1)]
        extra, self.table = blocks.adopt(linear, self.table)  # GGUF blocks (--kernels blocks): "blocks" packed
        self.wide = prefill_strategy(linear.weight.dtype) if self._bits is not None else self.plan.get(BUCKETS[-1], "nt")
        with torch.no_grad():
            self._packed = {**{s: _pack(s, self.weight) for s in set(self.plan.values()) if s in PACKED}, **extra}
        # plain attributes for the per-call checks (a Parameter is looked up through Module.__getattr__)
        self._dtype, self._dot = self.weight.dtype, self._packed.get("dot") if self.bias is None else None
        if self._bits is not None:
            self._dtype = torch.float32

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.numel() // self.in_features
        if not _ACTIVE or x.dtype != self._dtype:
            strategy = "nt"
        else:
            strategy = self.table[n] if n <= WIDE else self.wide
        if strategy == "nt":
            return F.linear(x, self.weight, self.bias)
        if strategy == "dot" and self._dot is not None and x.is_contiguous():  # the decoding step's path: no copies
            return _dot(x.view(n, self.in_features), self._dot).view(*x.shape[:-1], self.out_features)
        if self._bits is not None:
            y = apply16(strategy, x.reshape(n, self.in_features).contiguous(), self.weight, self._bits)
            if self.bias is not None:
                y = y + self.bias.float()
            return y.view(*x.shape[:-1], self.out_features)
        # both sides in the row-major layout the plan was measured with (a transposed view would make MKL pick
        # another, sometimes far slower, kernel in the next layer)
        y = _apply(strategy, x.reshape(n, self.in_features).contiguous(), self.weight, self._packed).contiguous()
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, plan={self.plan}"

    def __deepcopy__(self, memo):
        """A deep copy is a plain ``nn.Linear`` (draft copies are quantized or cast; the packed copies would be
        stale, and oneDNN tensors cannot be copied)."""
        import copy

        plain = torch.nn.Linear(self.in_features, self.out_features, bias=self.bias is not None)
        plain.weight = copy.deepcopy(self.weight, memo)
        if self.bias is not None:
            plain.bias = copy.deepcopy(self.bias, memo)
        return plain


# --- tuning ----------------------------------------------------------------------------------------------------------


def _linears(model) -> list[tuple[torch.nn.Module, str, torch.nn.Linear]]:
    """(parent, attribute, layer) for every float32 or 16-bit (:mod:`specdec_cli.runtime.kernels16`) CPU
    ``nn.Linear`` of ``model``."""
    out = []
    for parent in model.modules():
        for name, child in parent.named_children():
            if type(child) is torch.nn.Linear and child.weight.device.type == "cpu" and \
                    (child.weight.dtype == torch.float32 or is_16bit(child.weight)):
                out.append((parent, name, child))
    return out


@torch.inference_mode()
def tune_shape(weights: list[torch.Tensor], strategies=STRATEGIES, buckets=BUCKETS, reps: int = 3
               ) -> dict[int, str]:
    """Time every strategy for every bucket on these same-shape weights (streamed, as a forward streams them);
    returns bucket -> fastest strategy (``nt`` unless another is clearly faster).

    Strategies are timed round-robin, ``reps`` times each, keeping each one's best time, so a slow moment of a
    shared machine does not fall on one strategy only. Copying strategies (``wt``, ``mkldnn``) must beat the
    copy-free ones by the same margin ``nt`` must be beaten by."""
    out_features, in_features = weights[0].shape
    per = weights[0].numel() * weights[0].element_size()
    if per > TUNE_BYTES:  # a huge matrix (an LM head): time a slice of its rows, still far larger than any cache
        weights = [weights[0][: max(TUNE_BYTES // (in_features * weights[0].element_size()), 1)]]
    else:
        weights = weights[: max(TUNE_BYTES // per, 1)]
    packed = [{s: _pack(s, w) for s in strategies if s in PACKED} for w in weights]
    plan = {}
    for n in buckets:
        x = torch.randn(n, in_features)
        wide = n > WIDE  # compute-bound: a quarter of the weights is plenty, two rounds, no "tn"
        these = [s for s in strategies if not (wide and s == "tn") and not (n > DOT_ROWS and s == "dot")]
        subset = max(len(weights) // 4, 1) if wide else len(weights)
        best = {s: float("inf") for s in strategies}
        for rep in range((2 if wide else reps) + 1):  # the first round warms up
            for s in these:
                t0 = time.perf_counter()
                for w, p in zip(weights[:subset], packed[:subset]):
                    _apply(s, x, w, p).contiguous()
                if rep:
                    best[s] = min(best[s], time.perf_counter() - t0)
        free = min((s for s in these if s not in COPIES), key=best.get)
        if best[free] >= SWITCH_MARGIN * best["nt"]:
            free = "nt"
        fastest = min(best, key=best.get)
        plan[n] = fastest if best[fastest] < SWITCH_MARGIN * best[free] else free
    return plan


def machine_key() -> str:
    """This machine and torch setup, for caches of measurements (kernel plans, forward-time profiles)."""
    return f"{setup_key()}|v{PLAN_VERSION}"


def _plan_file() -> Path:
    from ..io.models import cache_root

    return cache_root() / "kernels" / "plans.json"


def load_plans() -> dict:
    try:
        plans = read_json(_plan_file())
    except (OSError, ValueError):
        return {}
    return plans if isinstance(plans, dict) else {}


def save_plans(plans: dict) -> None:
    write_cache(_plan_file(), json.dumps(plans, indent=1, sort_keys=True))  # read-only: a re-tune next time


def shape_key(weight: torch.Tensor) -> str:
    """A plan's key: ``OUTxIN`` for a float32 weight, ``OUTxIN:bf16`` / ``:fp16`` for a 16-bit one."""
    fmt = FORMATS.get(weight.dtype)
    return f"{weight.shape[0]}x{weight.shape[1]}" + (f":{fmt}" if fmt else "")


def plans_for(model, progress=None) -> dict[str, dict[int, str]]:
    """The plan of every weight shape and dtype of ``model`` (:func:`shape_key`): from the cache, else measured now
    (and cached)."""
    shapes: dict[str, list[torch.Tensor]] = {}
    for _, _, layer in _linears(model):
        shapes.setdefault(shape_key(layer.weight), []).append(layer.weight.detach())
    key = machine_key()
    cached = load_plans()
    mine = cached.setdefault(key, {})
    todo = [s for s in shapes if s not in mine]
    if todo and progress:
        progress(f"measuring CPU matmul kernels for {len(todo)} weight shape(s), once for this machine")
    for shape in todo:
        weights = shapes[shape]
        plan = tune_shape16(weights, BUCKETS, TUNE_BYTES) if is_16bit(weights[0]) else tune_shape(weights)
        mine[shape] = {str(n): s for n, s in plan.items()}
    if todo:
        save_plans(cached)
    return {shape: {int(n): s for n, s in mine[shape].items()} for shape in shapes}


def extra_bytes(plan: dict[int, str], weight: torch.Tensor) -> int:
    return len({s for s in plan.values() if s in COPIES}) * weight.numel() * weight.element_size()


def install(model, progress=None) -> dict:
    """Swap every float32 CPU ``nn.Linear`` of ``model`` for a :class:`FastLinear` with its measured plan.

    Returns a summary (layers swapped, strategies used, extra bytes). Plans needing copies are cut back to the
    copy-free strategies when the copies would not fit in the memory budget."""
    layers = _linears(model)
    if not layers:
        return {"layers": 0}
    plans = plans_for(model, progress)
    budget = EXTRA_MEMORY_FRACTION * available_bytes()
    extra = sum(extra_bytes(plans[shape_key(layer.weight)], layer.weight) for _, _, layer in layers)
    if extra > budget:
        plans = {shape: {n: (s if s not in COPIES else "nt") for n, s in plan.items()} for shape, plan in plans.items()}
        extra = 0
    used: dict[str, int] = {}
    object.__setattr__(model, SWAPS, getattr(model, SWAPS, 0) + 1)
    for parent, name, layer in layers:
        plan = plans[shape_key(layer.weight)]
        setattr(parent, name, FastLinear(layer, plan))
        for s in plan.values():
            used[s] = used.get(s, 0) + 1
    return {"layers": len(layers), "strategies": used, "extra_bytes": extra}
