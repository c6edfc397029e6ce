"""Greedy rows' next tokens from the LM head without its whole float32 product: a bfloat16 screen whose error is
bounded, then the few tokens it cannot rule out in float64. The token is the argmax of the float32 logits the
module code computes, proven per row; a row the proof cannot settle (a near-tie) is left to the float32 head, which
computes it (with every other such row of the forward) only when a reader reaches it (:class:`GreedyRows`).

Why (docs/profiling.md, "Where Gemma-3's step at 32 rows goes"): a greedy batch of 32 Gemma-3 rows spends 36 ms of
its 77 ms step in the 262,144 x 640 head, at the two cores' float32 limit, and every row reads only the head's
argmax. oneDNN's bfloat16 product (AVX512-BF16) takes the same head in 16.6 ms against 38 ms (32 rows). One greedy
sequence reads only argmaxes too: at one thread its one-row head takes 10.2 ms screened against 17.7.

The proof, per row ``h`` (the final norm's output, float32) and token ``v`` (its head row ``w_v``):

* the module's logit ``L_v`` is ``h . w_v`` summed in float32 in some order: ``|L_v - h.w_v| <= g * sum|h_i w_vi|``
  with ``g = n u / (1 - n u)``, ``u = 2**-24``, ``n`` the width (any order, any blocking: each product meets at
  most ``n`` roundings);
* the screen ``S_v`` is ``h~ . w~_v`` (both rounded to bfloat16: exact products, float32 sums, so the same bound),
  then rounded to bfloat16 (at most ``2**-6 |S_v|``, even truncated). Since ``h.w = h~.w~ + dh.w + h~.dw``:
  ``|L_v - S_v| <= |dh| |w_v| + |h~| |dw_v| + g |h| |w_v| + 2 g |h~| |w~_v| + 2**-6 |S_v|`` (Cauchy-Schwarz;
  ``|w_v|`` and ``|dw_v|`` bounded by their largest rows, measured once; the screen's sums counted at twice
  float32's roundoff, so a kernel that rounds to odd is covered too);
* so every token whose upper bound is below the top screened token's lower bound is not the argmax. The rest
  (1.6 on average over 378 greedy Gemma-3 steps of HumanEval, at most 13) get their exact ``h . w_v`` in float64
  (products of float32 numbers are exact there); the row's token is the one whose lower bound ``h.w_v - g
  sum|h_i w_vi|`` is above every other candidate's upper bound. Then it is the argmax of ``L`` whatever order the
  float32 kernel summed in. Otherwise -- a near-tie within float32 rounding (1 row in 378 there), more than
  :data:`TOP` candidates, a non-finite value, values outside the range where flushed denormals are negligible,
  a bound the candidates contradict -- that row's token comes from the float32 head, so every output is the
  one the float32 logits give. A forward none of whose rows settles computes the float32 head at once.
"""

from __future__ import annotations

import functools
import itertools
import math

import torch

from .machine import available_bytes, cpu_flags
from .products import _POINTWISE, mkldnn, pack

CHUNK = 16384  # head rows per slice when measuring the rounding's norms (Gemma-3: 16 slices of 40 MB)
TOP = 16  # candidates read per row from the screen (top-k): 378 Gemma-3 rows needed at most 13
U32 = 2.0 ** -24  # float32's unit roundoff
ROUND16 = 2.0 ** -6  # the screen's rounding to bfloat16, relative to the rounded value: truncated at most 2**-7 of
# the exact sum, so 2**-7 / (1 - 2**-7) < 2**-6 of the result (RNE: half of that)
SLACK = 1.001  # the norms and the bound itself are computed in floating point: 0.1% more covers their rounding
FLUSHED = 2.0 ** -100  # per term: the AVX512-BF16 product flushes denormal inputs and products (< 2**-126 times a
# weight or an activation element, and the screen is used only while both are below LARGEST)
LARGEST = 2.0 ** 26  # norms of the hidden rows and head rows (so every element) up to which FLUSHED covers a flush
MEMORY_FACTOR = 4  # the screen is made only where 4x its packed copy is available (the copy and its transients)
ENABLED = "auto"  # "auto": where the CPU multiplies bfloat16 natively; True/False: always/never (tests force it)


def native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (AVX512-BF16 or AMX), where the screen is ~2x the head's
    float32 speed; elsewhere it would be slower than the product it replaces."""
    return bool({"avx512_bf16", "amx_bf16"} & cpu_flags())


@functools.lru_cache(maxsize=1)
def works() -> bool:
    """Whether oneDNN's packed bfloat16 product runs here at all (a CPU without AVX-512 may lack the primitive)."""
    if not _POINTWISE:  # the packed op itself (products.mkldnn's other route converts every call)
        return False
    try:
        out = mkldnn(torch.ones(2, 8, dtype=torch.bfloat16), pack("mkldnn", torch.ones(4, 8, dtype=torch.bfloat16)))
        return out.shape == (2, 4) and bool((out == 8).all())
    except RuntimeError:
        return False


def usable(weight: torch.Tensor, softcap) -> bool:
    """Whether a head of this ``weight`` ``[V, n]`` may be screened: a float32 CPU weight, no logit soft-capping
    (``tanh`` may round two logits to one value, and the argmax then takes the lower index), oneDNN's packed
    product available, and the CPU fast at it (or :data:`ENABLED` forced)."""
    if ENABLED is False or softcap is not None or not works():
        return False
    if weight.dtype != torch.float32 or weight.device.type != "cpu" or weight.dim() != 2:
        return False
    if available_bytes() < MEMORY_FACTOR * weight.numel() * 2:  # a bfloat16 copy is 2 bytes a weight
        return False
    return ENABLED is True or native_bf16()


class HeadScreen:
    """The screen of one head ``weight`` ``[V, n]`` (float32): its bfloat16 copy packed for oneDNN (half the
    weight's bytes) and the largest row norms of the weight and of its rounding."""

    def __init__(self, weight: torch.Tensor):
        w = weight.detach()
        w16 = w.to(torch.bfloat16)
        self.packed = pack("mkldnn", w16)
        self.weight = w
        n = w.shape[1]
        self.g = n * U32 / (1 - n * U32)
        self.w_max = float(w.norm(dim=1).max()) * SLACK  # Gemma-3-270M: 1.035 (its rows are ~normalised)
        self.dw_max = max(float((part - w16[i: i + len(part)].float()).norm(dim=1).max())  # in slices of rows:
                          for i, part in zip(range(0, len(w), CHUNK), w.split(CHUNK))) * SLACK  # no 2nd copy
        self.flushed = n * FLUSHED
        self.settled = self.unsettled = 0  # forwards whose tokens the screen proved, and those it did not all prove
        self.rows_unsettled = 0  # the rows of those it left to the float32 head

    def rows(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The argmax of the float32 logits ``h @ weight.T`` for each row of ``h`` ``[R, n]`` (float32) -> ``[R]``
        (long), and whether the proof settled it ``[R]`` (bool; module doc): an unsettled row's id is meaningless,
        and its reader computes that row's float32 logits (:class:`GreedyRows`)."""
        ids, settled = self._tokens(h)
        if bool(settled.all()):
            self.settled += 1
        else:
            self.unsettled += 1
            self.rows_unsettled += int((~settled).sum())
        return ids, settled

    @torch.inference_mode()
    def _tokens(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h16 = h.to(torch.bfloat16)
        screen = mkldnn(h16, self.packed)  # [R, V] bfloat16
        top, idx = screen.topk(min(TOP, screen.shape[1]), dim=1)  # [R, TOP], sorted
        top = top.double()
        ok = torch.isfinite(top).all(dim=1)  # [R]: the rows whose proof may hold
        top = torch.where(ok[:, None], top, 0.0)  # a non-finite row proves nothing; its values must not spread
        hn = h.double().norm(dim=1) * SLACK
        dn = (h - h16.float()).double().norm(dim=1) * SLACK
        hn16 = h16.double().norm(dim=1) * SLACK
        ok &= (hn < LARGEST) & bool(self.w_max < LARGEST)  # FLUSHED's premise (a non-finite norm fails it too)
        rows = self.weight[idx].double()  # [R, TOP, n]
        hd = torch.where(ok[:, None], h, 0.0).double()[:, :, None]  # [R, n, 1]
        # [R, TOP]: h . w_v in float64 (the products exact; the sum's error, n * 2**-53 * sum|p|, is SLACK's)
        exact = torch.bmm(rows, hd)[..., 0]
        err = self.g * SLACK * torch.bmm(rows.abs(), hd.abs())[..., 0] + self.flushed  # |L_v - h . w_v|
        hi, lo = exact + err, exact - err
        # max L >= the best lower bound among the screen's top tokens; a token whose screen value's upper bound is
        # below that is not the argmax. The error of every S_v but its own rounding term: dh.w + h~.dw + both
        # products' float32 sums
        lower = lo.max(dim=1).values
        # (2 g for the screen's own sums: twice float32's roundoff; 2 flushed: the screen's flushes and the module's)
        base = dn * self.w_max + hn16 * self.dw_max + self.g * (hn + 2 * hn16) * (self.w_max + self.dw_max) \
            + 2 * self.flushed
        y = lower - base  # S_v + ROUND16 |S_v| >= y for a token that may be the argmax: invert s + ROUND16 |s|
        cut = torch.where(y >= 0, y / (1 + ROUND16), y / (1 - ROUND16))
        keep = top >= (cut - 1e-9 * cut.abs())[:, None]  # [R, TOP]; the cut lowered by far more than float64's
        # rounding of it (2**-52 relative), so a rounding never excludes a token
        ok &= keep.gather(1, lo.argmax(1, keepdim=True))[:, 0]  # the token that set the bound must pass it:
        # otherwise the bound was broken
        if top.shape[1] < screen.shape[1]:
            ok &= ~keep[:, -1]  # more candidates than TOP: not screened
        hi = torch.where(keep, hi, -math.inf)
        win = hi.argmax(dim=1, keepdim=True)  # the candidate whose upper bound is highest
        others = hi.scatter(1, win, -math.inf).max(dim=1).values
        ok &= lo.gather(1, win)[:, 0] > others  # else a near-tie within float32 rounding: the float32 head decides
        return idx.gather(1, win)[:, 0], ok


class GreedyRows:
    """A forward's greedy tokens ``[n]`` in place of its logits ``[n, V]``, for readers that take only the argmax
    (:func:`specdec_cli.engine.sampling.pick` when greedy): ``rows[i].argmax()`` is row ``i``'s token.

    Rows the screen did not settle are computed when first read, all of them by one float32 head product
    (``pending``: their mask ``[N]`` and the function that gives their float32 argmaxes): a tree's rows are read
    only along the path the target accepts, so a rejected branch's row -- often one with no clear next token, where
    the proof fails -- then costs nothing. Before, one such row sent the whole forward to the float32 head."""

    def __init__(self, ids: torch.Tensor, pending: tuple[torch.Tensor, object] | None = None, start: int = 0,
                 length: int | None = None):
        self.ids = ids  # [N] every row's token where settled; the parts of a split share it and ``pending``
        self.pending = pending
        self.start = start
        self.length = len(ids) - start if length is None else length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> "_Token":
        if not 0 <= i < self.length:
            raise IndexError(i)
        j = self.start + i
        if self.pending is not None and bool(self.pending[0][j]):
            unsettled, resolve = self.pending
            with torch.inference_mode():  # ids and the mask are inference tensors (made in the forward)
                self.ids[unsettled] = resolve(unsettled)  # every unsettled row at once: one pass over the head
                unsettled.zero_()  # resolved, for every part of a split
        return _Token(int(self.ids[j]))

    def split(self, sizes: list[int]) -> list["GreedyRows"]:
        starts = itertools.accumulate(sizes[:-1], initial=self.start)
        return [GreedyRows(self.ids, self.pending, s, n) for s, n in zip(starts, sizes)]

    def float(self) -> "GreedyRows":
        return self


class _Token:
    """One row of :class:`GreedyRows`: its ``argmax()`` is the token (a sampled reader has no logits to read)."""

    def __init__(self, token: int):
        self.token = token

    def argmax(self) -> int:
        return self.token


def screen_for(dec) -> HeadScreen | None:
    """The screen of a :class:`~specdec_cli.runtime.decoder.Decoder`'s head, made once per decoder (None: a head
    that is not screened -- see :func:`usable`; a biased or quantized head)."""
    screen = getattr(dec, "head_screen", False)
    if screen is False:
        head = getattr(dec.lm_head, "__self__", None)
        weight = getattr(head, "weight", None)
        ok = torch.is_tensor(weight) and getattr(head, "bias", None) is None and usable(weight, dec.softcap)
        dec.head_screen = screen = HeadScreen(weight) if ok else None
    return screen
