"""What a forward pass costs on this machine: ``t(n)``, the time of one forward over ``n`` new tokens.

Speculative decoding pays off only when verifying ``n`` draft tokens costs little more than one token, and how
little depends on the hardware (docs/profiling.md: on a 2-core CPU Gemma-3-270M's 3-token forward costs 1.8x its
1-token forward with PyTorch's stock kernels and 1.1x with :mod:`specdec_cli.runtime.kernels`; on a GPU it is flat up to
dozens of tokens). Like Sequoia's measured ``t_target(n)``, :func:`measure` times the model itself on the actual
device, dtype and thread count, after a short prefill, for ``n`` in :data:`POINTS`; between points the time is
interpolated linearly, beyond them extrapolated from the last two.

Profiles are cached under ``$SPECDEC_CACHE/hardware`` keyed by the machine, torch version, thread count, the
model's weights (name, dtype, shapes) and whether the tuned kernels are installed, so they are measured again
when any of those changes. Measuring takes about 3 s (SmolLM2-135M) to 4 s (Gemma-3-270M) on a 2-core Xeon VM.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..io.atomic import write_cache
from ..io.jsonl import read_json
from .cache import CACHE_SLACK
from .cache_mode import CacheMode
from .static_cache import WARM_CALLS

# Both ends of every row bucket of the kernel plans up to 32 (runtime/kernels.BUCKETS: 1, 2, 3, 4, 6, 8, 12, 16, 24,
# 32): a bucket's plan serves all its row counts, so t(n) rises steadily inside a bucket and may jump where the next
# one starts. Interpolating 8 -> 16 priced a 9-row SmolLM2 forward at 77 ms on the Xeon VM, where it took 118 ms
# (the plans change strategy at 9 rows): the budget bought 9-15-row drafts at two thirds of their price
# (docs/profiling.md, "Where t(n) jumps").
# Then 33 and 64: auto's widest forward is its 64 nodes + the root, and extrapolating from 25 -> 32 (one bucket, a flat
# slope) priced a 64-row SmolLM2 forward at 150 ms where it took 193.
POINTS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 16, 17, 24, 25, 32, 33, 64)
STATIC_TOP = 32  # a static (GPU) path times points up to here only: its buckets beyond compile in the run if needed
TWICE = 9  # sizes up to this one, where most drafts land, are timed twice (the best of two)
CONTEXT = 128  # tokens already in the cache while timing (attention cost grows slowly with it)
PERIOD = 32  # the timed text repeats a random block of this many tokens (see measure)
PROFILE_VERSION = 4  # 4: + 33 and 64; 3: both ends of every plan bucket to 32; 2: 1-4, 6, 8, 16, 32


@dataclass
class Profile:
    points: list[int]
    seconds: list[float]
    key: str = ""
    measured_s: float = 0.0
    info: dict = field(default_factory=dict)

    def __post_init__(self):
        self._x = np.asarray(self.points, dtype=np.float64)
        self._y = np.asarray(self.seconds, dtype=np.float64)
        self._memo: dict[int, float] = {}

    def __call__(self, n: int) -> float:
        """Seconds for a forward over ``n`` tokens (the root plus ``n - 1`` draft tokens)."""
        hit = self._memo.get(n)
        if hit is None:
            if n <= self._x[-1]:
                hit = float(np.interp(n, self._x, self._y))
            else:
                slope = (self._y[-1] - self._y[-2]) / (self._x[-1] - self._x[-2])
                hit = float(self._y[-1] + slope * (n - self._x[-1]))
            self._memo[n] = hit
        return hit

    def to_json(self) -> dict:
        return {"version": PROFILE_VERSION, "key": self.key, "points": self.points, "seconds": self.seconds,
                "measured_s": self.measured_s, "info": self.info}

    @classmethod
    def flat(cls, seconds: float = 1.0) -> "Profile":
        """A profile where every forward costs the same (tests, and ``--budget N``)."""
        return cls([1, 2], [seconds, seconds])


def model_key(model, extra: str = "") -> str:
    """Identity of a model's compute: class, dtype, device, weight shapes, installed kernel plans, the GGUF blocks
    its layers read (``--kernels blocks``: their rows then cost what de-quantizing costs, not what reading
    float32 costs), and whether its forwards take the lean path (:mod:`specdec_cli.runtime.decoder`)."""
    from .decoder import decoder_for
    from .hugepages import adopted
    from .jit import LOADED
    from .kernels import FastLinear, machine_key

    h = hashlib.sha256()
    dec = decoder_for(model)
    lean, compiled = dec is not None, dec is not None and dec.fused is not None  # compiled: runtime.fused's layers
    h.update(f"{machine_key()}|{type(model).__name__}|{extra}|lean={lean}|v{PROFILE_VERSION}".encode())
    if adopted(model):  # its weights in 2 MB pages (runtime/hugepages.py): 16-bit steps a quarter to a third faster
        h.update(b"|hugepages")
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if isinstance(weight, torch.Tensor):
            h.update(f"{name}:{type(module).__name__}:{tuple(weight.shape)}:{weight.dtype}:{weight.device}".encode())
        if isinstance(module, FastLinear):
            h.update(json.dumps(module.plan, sort_keys=True).encode())
            if "blocks" in module._packed:  # the rows that read them, and the compiled code this process runs (any
                # change to a compiling module measures them again; the float32 model's key is unchanged)
                h.update(f"blocks:{module._packed['blocks'][1]}:{module.table}:{LOADED}:{compiled}".encode())
    return h.hexdigest()[:24]


def screened(model) -> bool:
    """Whether a greedy forward of ``model`` reads its head through the bfloat16 screen (its lean path has one)."""
    from .decoder import decoder_for
    from .head_screen import screen_for

    dec = decoder_for(model)
    return dec is not None and dec.fused is None and not dec.wide and screen_for(dec) is not None


def _path(key: str) -> Path:
    from ..io.models import cache_root

    return cache_root() / "hardware" / f"{key}.json"


def load(key: str) -> Profile | None:
    """The cached profile of ``key``; None (measured again) when there is none or the file is not one we wrote."""
    try:
        data = read_json(_path(key))
        if data.get("version") != PROFILE_VERSION or data.get("key") != key:
            return None
        points, seconds = np.asarray(data["points"], np.float64), np.asarray(data["seconds"], np.float64)
        if points.ndim != 1 or points.shape != seconds.shape or len(points) < 2 or (np.diff(points) <= 0).any() \
                or not (np.isfinite(seconds).all() and (seconds > 0).all()):
            return None
        return Profile(data["points"], data["seconds"], key, float(data.get("measured_s", 0.0)),
                       dict(data.get("info", {})))
    except (OSError, ValueError, KeyError, TypeError, AttributeError, OverflowError):
        return None


def save(profile: Profile) -> None:
    write_cache(_path(profile.key), json.dumps(profile.to_json()))


def _tree(n_draft: int) -> list[int]:
    """A small binary-ish tree shape (the 4-D-mask path that tree drafts take)."""
    return [-1 if i < 2 else (i - 2) // 2 for i in range(n_draft)]


@torch.inference_mode()
def measure(model, points=POINTS, context: int = CONTEXT, cache_mode: CacheMode = CacheMode.EAGER,
            greedy: bool = False) -> Profile:
    """Forward times for ``points`` query sizes after ``context`` cached tokens, on the engine path ``cache_mode``
    (with the static cache every size is timed as the bucket it pads to -- compiled ones compile here, once).
    ``greedy``: on a greedy generation's cache, whose forwards may read the head through its screen
    (:mod:`specdec_cli.runtime.head_screen`), as the run they price will."""
    from . import forward
    from .decoder import decoder_for
    from .head_screen import screen_for

    t_start = time.perf_counter()
    points = [n for n in points if not cache_mode.static or n <= STATIC_TOP] or list(points[:1])
    vocab = model.get_input_embeddings().weight.shape[0]
    gen = torch.Generator().manual_seed(0)
    # a random block repeated: the model then predicts the next token with confidence, as in a real run, and a
    # greedy forward's head screen settles its rows as it does there (on random text SmolLM2's rows are near-ties
    # the screen leaves to the float32 head: a greedy profile would price the screen *and* the head, 10-20% above
    # what real forwards cost). The products' and attention's costs do not depend on the tokens.
    block = torch.randint(0, vocab, (PERIOD,), generator=gen).tolist()
    ctx = (block * ((context + max(points)) // PERIOD + 2))[: context + max(points) + 1]
    cache = forward.new_cache(model, context + max(points) + CACHE_SLACK, cache_mode,  # the widest timed forward fits
                              greedy=greedy)
    forward.forward_chain(model, cache, ctx[:context], keep=0)

    clock = forward.wall_clock(model)
    screen = screen_for(dec) if greedy and (dec := decoder_for(model)) is not None else None
    settled0, unsettled0 = (screen.settled, screen.unsettled) if screen else (0, 0)

    def once(n: int) -> float:
        t0 = clock()
        forward.forward_tree(model, cache, ctx[context], ctx[context + 1: context + n], _tree(n - 1))
        spent = clock() - t0
        forward.crop(cache, context)
        return spent

    # warm-up: allocations, first-use kernel selection. On a static path every bucket is warmed before any is
    # timed: its first call compiles it, and under CUDA graphs (reduce-overhead) the first calls of a graph warm
    # up and record it, so a size timed in the round-robin below before its bucket was replayed read as much more
    # (on an H200: 1-2 tokens 23-26 ms against 9 ms warm, larger sizes their compile times; no draft ever paid).
    for n in (points if cache_mode.static else (min(4, max(points)),)):
        for _ in range(WARM_CALLS if cache_mode.compiled else 1):
            once(n)
    best = {n: float("inf") for n in points}
    for rep in range(2):  # round-robin, so a slow moment of a shared machine does not skew one size only;
        for n in points:  # the cheap sizes, where draft sizes are decided, twice
            if rep == 0 or n <= TWICE:
                best[n] = min(best[n], once(n))
    seconds = list(np.maximum.accumulate([best[n] for n in points]))  # more tokens never cost less (noise aside)
    info = {"context": context, "threads": torch.get_num_threads(), "greedy": greedy}
    if greedy:  # how many timed forwards the screen settled whole (the rest: some rows left to the float32 head)
        info["screen_settled"] = [screen.settled - settled0, screen.unsettled - unsettled0] if screen else None
    return Profile(list(points), seconds, measured_s=time.perf_counter() - t_start, info=info)


def profile_for(model, extra: str = "", progress=None, cache_mode: CacheMode = CacheMode.EAGER,
                greedy: bool = False) -> Profile:
    """The cached profile of ``model`` on this machine, measured now if there is none. The key names a static
    path as ``|fast=static`` or ``|fast=compiled`` (the mode's value) and that every bucket is warmed first (profiles
    timed before that are measured again); the eager path's key adds nothing. ``greedy``: the profile of a greedy
    generation, which differs (``|greedy``) only where the model's head is screened: Gemma-3-270M's 1-row forward
    costs a fifth less there, and a profile of the float32 head priced every greedy forward above its cost."""
    greedy = greedy and screened(model)
    key = model_key(model, extra + (f"|fast={cache_mode.value}|warm=all" if cache_mode.static else "")
                    + ("|greedy" if greedy else ""))
    found = load(key)
    if found is not None:
        return found
    if progress:
        progress("measuring forward times on this machine (once per model and thread count)")
    profile = measure(model, cache_mode=cache_mode, greedy=greedy)
    profile.key = key
    save(profile)
    return profile
