"""GGUF's block formats as the tiles read them (:mod:`specdec_cli.runtime.tiles`, ``--kernels blocks``): their
layout, their de-quantization in registers (LLVM IR the tiles' loops inline), and gguf's reference de-quantization
(the tiles' path without numba, and what the IR must equal bit for bit).

ggml's layout: blocks of 32 weights of one row each.

* ``Q4_1``: float16 scale ``d`` and minimum ``m``, then 16 bytes of nibbles (weight ``i`` the low nibble of byte
  ``i``, weight ``i + 16`` the high one); ``w = d * q + m``.
* ``Q8_0``: float16 ``d``, then 32 int8; ``w = q * d``.
* ``Q5_0``: float16 ``d``, 32 high bits (bit ``i``: weight ``i``'s fifth bit), then ``Q4_1``'s nibbles;
  ``w = d * (q - 16)``.
"""

from __future__ import annotations

import numpy as np

Q4_1, Q8_0, Q5_0 = 3, 4, 5  # the tiles' format numbers (0-2: float32, bfloat16, float16)
BLOCK_FORMATS = (Q4_1, Q8_0, Q5_0)
GGUF_NAMES = {Q4_1: "Q4_1", Q8_0: "Q8_0", Q5_0: "Q5_0"}  # format number -> gguf's tensor type name
BLOCK = 32  # weights per block
BLOCK_BYTES = np.array([0, 0, 0, 20, 34, 22], np.int64)  # bytes of one block, by format number
AHEAD = 2  # tiles ahead that the blocks' prefetch asks for (SmolLM2's step, one thread: 1 -> 16.3 ms of products,
# 2 -> 15.1 ms, 3 -> 16.2 ms)
VECTOR = 8  # float32 lanes of the tiles' accumulators (tiles.VECTOR)


def dequantize(w: np.ndarray, fmt: int) -> np.ndarray:
    """gguf's own reference de-quantization (``gguf.quants``, a dependency), in float32: blocks
    ``[N, K / 32 * bytes]`` -> ``[N, K]``."""
    from gguf import GGMLQuantizationType, quants

    return quants.dequantize(w, GGMLQuantizationType[GGUF_NAMES[fmt]]).astype(np.float32, copy=False)


try:  # pragma: no cover - without llvmlite (no numba) the tiles never emit these
    from llvmlite import ir
    from numba.core import cgutils
except ImportError:  # pragma: no cover
    ir = None
else:
    _F32, _I32, _I64 = ir.FloatType(), ir.IntType(32), ir.IntType(64)
    _VF, _VI32 = ir.VectorType(_F32, VECTOR), ir.VectorType(_I32, VECTOR)


def block_weights(builder, w_addr, row_bytes, j: int, b, fmt: int) -> list:
    """Block ``b`` of weight row ``j`` (GGUF) as four float32 vectors (weights ``32b + 8i .. 32b + 8i + 7``),
    de-quantized as gguf's reference does it in float32 (``d * q + m``: multiply, then add; ``q * d``): the
    bits of the de-quantized file."""
    c64 = lambda v: ir.Constant(_I64, v)  # noqa: E731
    at = builder.add(builder.add(w_addr, builder.mul(row_bytes, c64(j))),
                     builder.mul(b, c64(int(BLOCK_BYTES[fmt]))))
    ptr = lambda off, kind: builder.inttoptr(builder.add(at, c64(off)), kind.as_pointer())  # noqa: E731
    splat = lambda v: builder.shuffle_vector(  # noqa: E731 - one float in every lane
        builder.insert_element(ir.Constant(_VF, ir.Undefined), v, ir.Constant(_I32, 0)),
        ir.Constant(_VF, ir.Undefined), ir.Constant(_VI32, [0] * VECTOR))
    d = splat(builder.fpext(builder.load(ptr(0, ir.HalfType())), _F32))
    v8 = ir.VectorType(ir.IntType(8), VECTOR)
    if fmt == Q8_0:
        return [builder.fmul(builder.sitofp(builder.load(ptr(2 + 8 * i, v8), align=1), _VF), d) for i in range(4)]
    first = 6 if fmt == Q5_0 else 4  # the nibbles' first byte
    low = [builder.zext(builder.load(ptr(first + 8 * i, v8), align=1), _VI32) for i in range(2)]
    q = [builder.and_(v, ir.Constant(_VI32, [15] * VECTOR)) for v in low]
    q += [builder.lshr(v, ir.Constant(_VI32, [4] * VECTOR)) for v in low]  # weights 16-31: the high nibbles
    if fmt == Q5_0:  # bit i of the 32 high bits is weight i's fifth bit; q - 16 in -16 .. 15
        high = builder.load(ptr(2, _I32), align=1)
        high = builder.shuffle_vector(builder.insert_element(ir.Constant(_VI32, ir.Undefined), high,
                                                             ir.Constant(_I32, 0)),
                                      ir.Constant(_VI32, ir.Undefined), ir.Constant(_VI32, [0] * VECTOR))
        one, four, sixteen = (ir.Constant(_VI32, [v] * VECTOR) for v in (1, 4, 16))
        bits = [builder.shl(builder.and_(builder.lshr(high, ir.Constant(_VI32, list(range(8 * i, 8 * i + 8)))),
                                         one), four) for i in range(4)]
        return [builder.fmul(d, builder.sitofp(builder.sub(builder.or_(v, b), sixteen), _VF))
                for v, b in zip(q, bits)]
    # d * q is exact in float32 (an 11-bit float16 mantissa times a 4-bit integer), so one fused multiply-add
    # rounds d * q + m exactly as gguf's multiply-then-add does: the same bits, one operation fewer
    m = splat(builder.fpext(builder.load(ptr(2, ir.HalfType())), _F32))
    fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VF, [_VF] * 3), "llvm.fma.v8f32")
    return [builder.call(fma, [d, builder.uitofp(v, _VF), m]) for v in q]


def prefetch_blocks(builder, w_addr, row_bytes, b, outs: int, fmt: int):
    """The tiles' prefetch for GGUF blocks: the rows of the tile :data:`AHEAD` tiles on follow this tile's, so ask,
    per block, for as many of their bytes as this tile reads (``outs`` blocks; one tile is ``outs`` short rows,
    too short for the hardware's stream prefetcher)."""
    c64 = lambda v: ir.Constant(_I64, v)  # noqa: E731
    per_block = outs * int(BLOCK_BYTES[fmt])
    i8p = ir.IntType(8).as_pointer()
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i8p, _I32, _I32, _I32]),
                                        "llvm.prefetch.p0i8")
    at = builder.add(builder.add(w_addr, builder.mul(row_bytes, c64(AHEAD * outs))), builder.mul(b, c64(per_block)))
    for line in range(0, per_block, 64):
        ptr = builder.inttoptr(builder.add(at, c64(line)), i8p)
        builder.call(fn, [ptr, ir.Constant(_I32, 0), ir.Constant(_I32, 3), ir.Constant(_I32, 1)])

