"""A wide 16-bit model's compared forwards (decoding, verification) as two compiled calls per layer; a GGUF blocks
model's too (``--kernels blocks``, :mod:`specdec_cli.runtime.blocks`: its products read the file's blocks).

Why (issue 35, docs/profiling.md): with 16-bit weights a SmolLM2-135M step reads 270 MB, ~9 ms at this CPU's read
bandwidth, while the ~35 small tensor operations per layer between the matrix products (norms, rotary, reshapes,
adds, activation, the kernels' wrappers) cost 5-8 ms on top: the products alone would be a 1.7x faster step than
float32, the whole step only ~1.4x. Here each layer is

* :func:`qkv_step` -- the input norm, the q/k/v products, Gemma's q/k norms and the rotary embedding;
* the new keys and values written into a growing cache layer's buffers through numpy views (:meth:`Fused.host_rows`;
  where ``update`` writes them), or the layer's own ``update`` for other layers;
* :func:`out_step` -- attention (:func:`specdec_cli.runtime.attend.attend`), the output product, the norms, the
  MLP and the residual adds;

with every reduction in one fixed order per row (RMSNorm's sum of squares by the fixed-lane dot product of
:mod:`specdec_cli.runtime.dot16`, the products by its kernels), so a row's numbers do not depend on the rows beside
it. The operations are the float32 model's (SiLU and tanh-GELU by :func:`_exp`-based formulas, to float32
rounding); a prefill, whose rows no one compares, runs the tensor path instead (:mod:`specdec_cli.runtime.decoder`).
"""

from __future__ import annotations

import weakref

import numpy as np
import torch

from .jit import COMPILED, njit

ACTIVATIONS = {"silu": 0, "gelu_pytorch_tanh": 1}  # the MLP activations out_step computes
# error_model="numpy" below: numba's default checks every float division for zero (to raise as Python does), a branch
# that kept LLVM from vectorising the activation's loop (SmolLM2, 8 rows x 1536: 57 -> 8 us a layer). No division
# here can be by zero (1 + exp(.), the norms' square roots of eps and more), and every result keeps its bits.
FMT = {torch.bfloat16: 1, torch.float16: 2}  # tiles' format numbers (runtime/tiles.py: F32 0, BF16 1, FP16 2;
# GGUF blocks 3-7, runtime/ggml_blocks.py)
GELU_C, GELU_A = np.float32(0.7978845608028654), np.float32(0.044715)  # sqrt(2 / pi); tanh-GELU's cubic term
EXP_HI, EXP_LO = np.float32(88.0), np.float32(-87.0)  # exp's argument kept where 2**n is a normal float32

if COMPILED:  # pragma: no branch - without numba no model is wide (kernels16.FORMATS is empty)
    from .attend import LN2_HI, LN2_LO, LOG2E, P0, P1, P2, P3, P4, P5, _float_bits, attend
    from .dot16 import LANES, f32_1
    from .tiles import dot_tiled


@njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _exp(x):  # pragma: no cover - compiled
    """``exp(x)`` (float32) by attend's polynomial, the argument clamped to float32's normal range."""
    if x < EXP_LO:
        return np.float32(0.0)
    x = min(x, EXP_HI)
    n = np.floor(x * LOG2E + np.float32(0.5))
    r = x - n * LN2_HI - n * LN2_LO
    p = ((((P0 * r + P1) * r + P2) * r + P3) * r + P4) * r + P5
    p = p * r * r + r + np.float32(1.0)
    return p * _float_bits(np.int32((np.int32(n) + 127) << 23))


@njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _dot(fmt, x, w, y, block):  # pragma: no cover - compiled
    """``y = x @ widen(w).T`` by the tiles (``block`` >= 2: row pairs; the same bits either way)."""
    dot_tiled(x, w, y, fmt, block >= 2)


@njit(cache=True, nogil=True, boundscheck=False, error_model="numpy")
def _norm(x, w, eps, gemma, out):  # pragma: no cover - compiled
    """RMSNorm of each row of ``x [n, D]`` into ``out``: Llama ``w * (x * r)``, Gemma ``(x * r) * w`` (``w`` is then
    ``1 + weight``), ``r = 1 / sqrt(mean(x^2) + eps)`` with the sum of squares in dot16's fixed order."""
    n, d = x.shape
    chunks = d // LANES
    ss = np.empty(1, np.float32)
    for r in range(n):
        row = x[r]
        f32_1(row.ctypes.data, d, row.ctypes.data, chunks, ss.ctypes.data, 1)
        s = ss[0]
        for j in range(chunks * LANES, d):
            s = s + row[j] * row[j]
        scale = np.float32(1.0) / np.sqrt(s / np.float32(d) + eps)
        for j in range(d):
            out[r, j] = (row[j] * scale) * w[j] if gemma else w[j] * (row[j] * scale)


@njit(cache=True, nogil=True, boundscheck=False, error_model="numpy")
def _rope(x, cos, sin):  # pragma: no cover - compiled
    """``x [n, heads, hd]`` rotated in place: ``x * cos + roll(x, hd / 2) * sin`` (``sin``'s first half negated)."""
    n, heads, hd = x.shape
    half = hd // 2
    tmp = np.empty(hd, np.float32)
    for r in range(n):
        for h in range(heads):
            for j in range(hd):
                tmp[j] = x[r, h, j] * cos[r, j] + x[r, h, (j + half) % hd] * sin[r, j]
            x[r, h] = tmp


@njit(cache=True, nogil=True, boundscheck=False, error_model="numpy")
def qkv_step(x, fmts, wq, wk, wv, blocks, norm_w, eps, gemma, qn_w, kn_w, cos, sin, q, k, v):  # pragma: no cover
    """``q [n, H, hd]``, ``k``, ``v`` ``[n, KVH, hd]`` of one layer for the residual rows ``x [n, D]``."""
    n = x.shape[0]
    h = np.empty_like(x)
    _norm(x, norm_w, eps, gemma, h)
    _dot(fmts[0], h, wq, q.reshape(n, -1), blocks[0])
    _dot(fmts[1], h, wk, k.reshape(n, -1), blocks[1])
    _dot(fmts[2], h, wv, v.reshape(n, -1), blocks[2])
    if qn_w.shape[0]:  # Gemma's per-head q/k norms
        hd = q.shape[2]
        for name in range(2):
            t = q if name == 0 else k
            flat = t.reshape(-1, hd)
            _norm(flat.copy(), qn_w if name == 0 else kn_w, eps, gemma, flat)
    _rope(q, cos, sin)
    _rope(k, cos, sin)


@njit(cache=True, nogil=True, boundscheck=False, error_model="numpy")
def _act(g, u, kind):  # pragma: no cover - compiled
    """``g = act(g) * u`` in place: SiLU ``g / (1 + exp(-g))`` or tanh-GELU ``g / 2 * (1 + tanh(c (g + a g^3)))``."""
    flat_g, flat_u = g.reshape(-1), u.reshape(-1)
    for i in range(flat_g.shape[0]):
        x = flat_g[i]
        if kind == 0:
            y = x / (np.float32(1.0) + _exp(-x))
        else:
            t = np.float32(2.0) * (GELU_C * (x + GELU_A * x * x * x))
            y = np.float32(0.5) * x * (np.float32(2.0) - np.float32(2.0) / (_exp(t) + np.float32(1.0)))
        flat_g[i] = y * flat_u[i]


@njit(cache=True, nogil=True, boundscheck=False, error_model="numpy")
def out_step(x, q, keys, values, start, stop, visible, scale, fmts, wo, wg, wu, wd, blocks, norms, eps, gemma,
             act):  # pragma: no cover - compiled
    """The rest of one layer on the residual rows ``x [n, D]`` (updated in place): attention of ``q`` over the
    cache's columns ``[start, stop)``, the output product, (Gemma: its norm), the residual add, the MLP's norm,
    products and activation, (Gemma: its norm), the residual add. ``norms [k, D]``: Llama's post-attention norm;
    Gemma's post-attention, pre- and post-feed-forward norms (as ``1 + w``)."""
    n, d = x.shape
    heads, hd = q.shape[1], q.shape[2]
    a = np.empty((n, heads, hd), np.float32)
    attend(q, keys, values, start, stop, visible, scale, a)
    o = np.empty((n, d), np.float32)
    _dot(fmts[3], a.reshape(n, heads * hd), wo, o, blocks[3])
    if gemma:
        _norm(o.copy(), norms[0], eps, True, o)
    x += o
    h = np.empty_like(x)
    _norm(x, norms[1] if gemma else norms[0], eps, gemma, h)
    g = np.empty((n, wg.shape[0]), np.float32)
    u = np.empty((n, wu.shape[0]), np.float32)
    _dot(fmts[4], h, wg, g, blocks[4])
    _dot(fmts[5], h, wu, u, blocks[5])
    _act(g, u, act)
    _dot(fmts[6], g, wd, o, blocks[6])
    if gemma:
        _norm(o.copy(), norms[2], eps, True, o)
    x += o


@njit(cache=True, nogil=True, boundscheck=False, error_model="numpy")
def head_step(x, norm_w, eps, gemma, fmt, w, block, out):  # pragma: no cover - compiled
    """The final norm and the LM head: ``out [n, V]`` for the residual rows ``x [n, D]``."""
    h = np.empty_like(x)
    _norm(x, norm_w, eps, gemma, h)
    _dot(fmt, h, w, out, block)


# --- the Python side: one model's arrays, one forward -------------------------------------------------------------

NO_NORM = np.zeros(0, np.float32)  # "no q/k norms" (Llama)
EVERY_COLUMN = np.zeros((0, 0), np.bool_)  # attend's "visible" when a row sees every column


class WideLayer:
    """One layer's arrays as :func:`qkv_step` and :func:`out_step` take them (views of the model's weights)."""

    def __init__(self, layer, gemma: bool):
        mods = [f.__self__ for f in (layer.q, layer.k, layer.v, layer.o, layer.gate, layer.up, layer.down)]
        self.modules = mods
        self.w, fmts = zip(*(stored_weight(m) for m in mods))
        self.fmts = np.array(fmts, np.int64)
        self.norm_in = layer.norms[0][0].numpy()
        self.norms = np.stack([w.numpy() for w, _ in layer.norms[1:]])
        self.qn = layer.q_norm[0].numpy() if layer.q_norm is not None else NO_NORM
        self.kn = layer.k_norm[0].numpy() if layer.k_norm is not None else NO_NORM
        self._blocks: dict[int, np.ndarray] = {}

    def blocks(self, n: int) -> np.ndarray:
        """Rows per weight load for each product at ``n`` rows, from the measured plans (the same bits whichever)."""
        hit = self._blocks.get(n)
        if hit is None:
            from .kernels16 import BLOCKED

            hit = self._blocks[n] = np.array([BLOCKED.get(m.table[n] if n < len(m.table) else m.wide, 2)
                                              for m in self.modules], np.int64)
        return hit


def stored_weight(linear) -> tuple[np.ndarray, int]:
    """A linear layer's weight as the tiles read it and its tiles format: 16-bit bits (``uint16``), a GGUF file's
    blocks (``uint8``, ``--kernels blocks``), or the float32 weight's bytes (``uint8``: a blocks model's layer the
    file gave no blocks for; every weight of one model then has one array type, so one compiled signature)."""
    if linear._bits is not None:
        return linear._bits, FMT[linear.weight.dtype]
    found = linear._packed.get("blocks")
    if found is not None:
        return found
    return linear.weight.detach().numpy().view(np.uint8), 0


def fused_for(dec, model):
    """The compiled per-layer path of a wide or GGUF blocks decoder, or None where it does not apply (other
    activations, norms with different epsilons, linear layers with biases)."""
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    act = getattr(cfg, "hidden_act", None) if dec.kind == "llama" else getattr(cfg, "hidden_activation", None)
    eps = {e for layer in dec.layers for _, e in layer.norms} | {dec.final_norm[1]}
    for layer in dec.layers:
        eps |= {n[1] for n in (layer.q_norm, layer.k_norm) if n is not None}
    head = dec.lm_head.__self__
    if act not in ACTIVATIONS or len(eps) != 1 or any(m.bias is not None for m in model.modules()
                                                      if hasattr(m, "_bits")):
        return None
    return Fused(dec, [WideLayer(layer, dec.kind == "gemma3") for layer in dec.layers], ACTIVATIONS[act],
                 np.float32(eps.pop()), head)


class Fused:
    def __init__(self, dec, layers: list[WideLayer], act: int, eps, head):
        self.dec, self.layers, self.act, self.eps, self.head = dec, layers, act, eps, head
        self.head_w, self.head_fmt = stored_weight(head)
        self.final = dec.final_norm[0].numpy()
        self._host = weakref.WeakKeyDictionary()  # cache layer -> (its key buffer, numpy keys, numpy values)

    def host_rows(self, layer, n: int):
        """A growing cache layer's whole key and value buffers as numpy ``[KVH, capacity, hd]``, with room made for
        ``n`` rows at its length, or None (another layer kind, or not one CPU float32 sequence). The caller writes
        the rows there and sets the length: what ``update`` does, without its torch slicing, a quarter of a 16-bit
        SmolLM2 step's time outside the products (docs/profiling.md)."""
        if not getattr(layer, "grows", False) or not layer.is_initialized:
            return None
        layer.make_room(layer.length, layer.length + n, None, None, None)
        keys, values = layer.buffers()
        hit = self._host.get(layer)
        if hit is None or hit[0] is not keys:  # new buffers: first use, or grown
            ok = keys.shape[0] == 1 and keys.dtype == torch.float32 and keys.device.type == "cpu"
            hit = self._host[layer] = (keys, *((keys[0].numpy(), values[0].numpy()) if ok else (None, None)))
        return None if hit[1] is None else hit[1:]

    def forward(self, cache, x: torch.Tensor, rope: dict, seen, keep: int | None) -> torch.Tensor:
        """Logits (float32) of the rows ``x [1, n, D]`` (the embedded tokens; ``rope``: per rotary kind the rows'
        cos/sin ``[n, hd]``; ``seen``: per layer type the visible columns, or None)."""
        dec, n = self.dec, x.shape[1]
        gemma = dec.kind == "gemma3"
        xs = x[0].contiguous().numpy()
        q = np.empty((n, dec.heads, dec.head_dim), np.float32)
        k = np.empty((n, dec.kv_heads, dec.head_dim), np.float32)
        v = np.empty_like(k)
        kt = torch.from_numpy(k).view(1, n, dec.kv_heads, dec.head_dim).transpose(1, 2)
        vt = torch.from_numpy(v).view(1, n, dec.kv_heads, dec.head_dim).transpose(1, 2)
        scale = np.float32(dec.scale)
        for i, (wl, cache_layer, layer) in enumerate(zip(self.layers, cache.layers, dec.layers)):
            blocks = wl.blocks(n)
            cos, sin = rope[layer.rope]
            qkv_step(xs, wl.fmts, wl.w[0], wl.w[1], wl.w[2], blocks, wl.norm_in, self.eps, gemma, wl.qn, wl.kn,
                     cos, sin, q, k, v)
            past = cache_layer.length
            views = self.host_rows(cache_layer, n)
            if views is None:  # another cache layer: its own update
                cache_layer.update(kt, vt)
                keys, values = (t[0].numpy() for t in cache_layer.buffers())
            else:  # the same rows written where update writes them, in numpy
                keys, values = views
                keys[:, past: past + n] = k.transpose(1, 0, 2)
                values[:, past: past + n] = v.transpose(1, 0, 2)
                cache_layer.set_length(past + n)
            m = seen if seen is None or not isinstance(seen, dict) else seen[dec.types[i]]
            out_step(xs, q, keys, values, cache_layer.visible_start(past), cache_layer.length,
                     EVERY_COLUMN if m is None else m, scale, wl.fmts, wl.w[3], wl.w[4], wl.w[5],
                     wl.w[6], blocks, wl.norms, self.eps, gemma, self.act)
        rows = xs if keep is None else xs[n - keep:]
        logits = torch.empty((rows.shape[0], dec.vocab), dtype=torch.float32)
        block = self.layers[0].blocks(rows.shape[0])[0] if rows.shape[0] else 1
        head_step(np.ascontiguousarray(rows), self.final, self.eps, gemma, self.head_fmt, self.head_w, block,
                  logits.numpy())
        return logits
