"""The ``dot16`` kernels: float32 rows times 16-bit weights (bfloat16 or float16), the weights streamed as stored
and widened to float32 in registers, the products accumulated in float32.

Why (issue 35, docs/profiling.md): a decoding step reads every weight once, so on the CPU its time is the weights'
bytes over the memory bandwidth. Stored as 16 bits the weights are half the bytes of float32; PyTorch's own bf16
CPU products for one row stream far below the bound (``--dtype bfloat16`` ran at 22.8 tok/s on SmolLM2 against
35.4 in float32). numba has no 16-bit float type, so the weights are read as ``uint16`` and widened by LLVM vector
code made here (:func:`_block`): bfloat16 is the upper half of a float32 (zero-extend, shift left by 16),
float16 converts exactly to float32 (``fpext``: one ``vcvtph2ps`` per 8 weights with F16C).

**Row invariance by construction.** Each output is a sum in one fixed order, written out in the IR with no
fast-math flags, so LLVM may not reorder it: lane ``l`` of :data:`LANES` accumulates the products of ``k = l, l +
LANES, ...`` with fused multiply-adds (``llvm.fma``: one rounding each), the lanes are added in a fixed tree, then
the ``K mod LANES`` leftover products one by one. A block of 1, 2 or 4 rows (:data:`BLOCKS`) loads each weight
vector once for all its rows and runs exactly those operations per row, so every blocking gives every row the
same bits: a verified draft row's logits are a one-row forward's, whatever the number of rows beside it, and the
kernel plans (:mod:`specdec_cli.runtime.kernels`) may pick the blocking per row count by speed alone.
"""

from __future__ import annotations

import threading

import numpy as np

from .jit import COMPILED, njit

VECTOR = 8  # float32 lanes of one AVX2 register: the width the IR's vectors are written in
ACCUMULATORS = 4  # vectors per row: 4 x 8 = 32 independent sums hide the FMA latency (one row at 1 FMA/cycle)
LANES = VECTOR * ACCUMULATORS
BLOCKS = (1, 2, 4)  # rows per weight load: 4 rows x 4 accumulators = 16 registers, AVX2's count
FORMATS = ("bf16", "fp16")

if COMPILED:  # pragma: no branch - without numba there is no dot16 (kernels.STRATEGIES leaves it out)
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    _F32, _I16, _I32, _I64 = ir.FloatType(), ir.IntType(16), ir.IntType(32), ir.IntType(64)
    _VF, _VI16, _VI32 = ir.VectorType(_F32, VECTOR), ir.VectorType(_I16, VECTOR), ir.VectorType(_I32, VECTOR)

    def _load_vector(builder, wp, k, fmt: str):
        """8 weights from ``k`` on as float32: bf16 -> bits << 16; fp16 -> ``fpext`` (exact); f32 as they are."""
        if fmt == "f32":
            return builder.load(builder.bitcast(builder.gep(wp, [k]), _VF.as_pointer()), align=4)
        wv = builder.load(builder.bitcast(builder.gep(wp, [k]), _VI16.as_pointer()), align=2)
        if fmt == "bf16":
            return builder.bitcast(builder.shl(builder.zext(wv, _VI32), ir.Constant(_VI32, [16] * VECTOR)), _VF)
        return builder.fpext(builder.bitcast(wv, ir.VectorType(ir.HalfType(), VECTOR)), _VF)

    def _lane_sum(builder, vectors):
        """The fixed reduction of one row's accumulators: (a0 + a1) + (a2 + a3), then halves 4 + 4, 2 + 2, 1 + 1."""
        s = builder.fadd(builder.fadd(vectors[0], vectors[1]), builder.fadd(vectors[2], vectors[3]))
        width = VECTOR // 2
        while width:
            lo = builder.shuffle_vector(s, s, ir.Constant(ir.VectorType(_I32, width), list(range(width))))
            hi = builder.shuffle_vector(s, s, ir.Constant(ir.VectorType(_I32, width), list(range(width, 2 * width))))
            s, width = builder.fadd(lo, hi), width // 2
        return builder.extract_element(s, ir.Constant(_I32, 0))

    def _block(rows: int, fmt: str):
        """An intrinsic ``block(x_addr, x_stride, w_addr, chunks, y_addr, y_stride)``: for ``rows`` float32 rows at
        ``x_addr`` (``x_stride`` floats apart) and one weight row at ``w_addr``, the sums over the first ``chunks *
        LANES`` products, stored at ``y_addr`` (``y_stride`` floats apart)."""

        @intrinsic
        def block(typingctx, x_addr, x_stride, w_addr, chunks, y_addr, y_stride):
            sig = types.void(types.intp, types.intp, types.intp, types.intp, types.intp, types.intp)
            return sig, lambda context, builder, signature, args: _emit(context, builder, args, rows, fmt)

        return block

    def _emit(context, builder, args, rows: int, fmt: str):
        x_addr, x_stride, w_addr, chunks, y_addr, y_stride = args
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VF, [_VF] * 3), "llvm.fma.v8f32")
        xp = builder.inttoptr(x_addr, _F32.as_pointer())
        wp = builder.inttoptr(w_addr, (_F32 if fmt == "f32" else _I16).as_pointer())
        zero = ir.Constant(_VF, [0.0] * VECTOR)
        entry = builder.block
        loop, done = builder.append_basic_block("dot16.loop"), builder.append_basic_block("dot16.done")
        builder.cbranch(builder.icmp_signed(">", chunks, ir.Constant(_I64, 0)), loop, done)
        builder.position_at_end(loop)
        c = builder.phi(_I64)
        accs = [[builder.phi(_VF) for _ in range(ACCUMULATORS)] for _ in range(rows)]
        new = [[None] * ACCUMULATORS for _ in range(rows)]
        for v in range(ACCUMULATORS):
            k = builder.add(builder.mul(c, ir.Constant(_I64, LANES)), ir.Constant(_I64, VECTOR * v))
            wf = _load_vector(builder, wp, k, fmt)
            for r in range(rows):
                at = builder.add(builder.mul(x_stride, ir.Constant(_I64, r)), k)
                xv = builder.load(builder.bitcast(builder.gep(xp, [at]), _VF.as_pointer()), align=4)
                new[r][v] = builder.call(fma, [xv, wf, accs[r][v]])
        step = builder.add(c, ir.Constant(_I64, 1))
        tail = builder.block
        c.add_incoming(ir.Constant(_I64, 0), entry)
        c.add_incoming(step, tail)
        for r in range(rows):
            for v in range(ACCUMULATORS):
                accs[r][v].add_incoming(zero, entry)
                accs[r][v].add_incoming(new[r][v], tail)
        builder.cbranch(builder.icmp_signed("<", step, chunks), loop, done)
        builder.position_at_end(done)
        finals = []
        for r in range(rows):  # every phi first: LLVM wants them at the top of the block
            finals.append([builder.phi(_VF) for _ in range(ACCUMULATORS)])
            for v, phi in enumerate(finals[-1]):
                phi.add_incoming(zero, entry)
                phi.add_incoming(new[r][v], tail)
        yp = builder.inttoptr(y_addr, _F32.as_pointer())
        for r, vectors in enumerate(finals):
            builder.store(_lane_sum(builder, vectors), builder.gep(yp, [builder.mul(y_stride, ir.Constant(_I64, r))]))
        return context.get_dummy_value()

    def _scalar(fmt: str):
        """An intrinsic widening one stored weight (``uint16``) to float32, for the ``K mod LANES`` leftovers."""

        @intrinsic
        def widen(typingctx, u):
            def codegen(context, builder, signature, args):
                if fmt == "bf16":
                    return builder.bitcast(builder.shl(builder.zext(args[0], _I32), ir.Constant(_I32, 16)), _F32)
                return builder.fpext(builder.bitcast(args[0], ir.HalfType()), _F32)

            return types.float32(types.uint16), codegen

        return widen

    f32_1, f32_2, f32_4 = (_block(r, "f32") for r in BLOCKS)  # float32 "weights": runtime.attend's q . k
    _bf16_1, _bf16_2, _bf16_4 = (_block(r, "bf16") for r in BLOCKS)
    _fp16_1, _fp16_2, _fp16_4 = (_block(r, "fp16") for r in BLOCKS)
    widen_bf16, widen_fp16 = _scalar("bf16"), _scalar("fp16")

    @njit(cache=True, nogil=True, boundscheck=False)
    def dot_bf16(x, w, y, block):  # pragma: no cover - compiled
        """``y[r, j] = x[r] . bf16(w[j])``: float32 ``x [n, K]``, ``uint16`` ``w [N, K]`` (bfloat16 bits), float32
        ``y [n, N]``, all C-contiguous; ``block``: rows per weight load (1, 2 or 4; same bits whichever)."""
        n, k_dim = x.shape
        n_out = w.shape[0]
        chunks = k_dim // LANES
        xa, wa, ya = x.ctypes.data, w.ctypes.data, y.ctypes.data
        by4 = n - n % 4 if block == 4 else 0
        by2 = by4 + (n - by4) - (n - by4) % 2 if block >= 2 else 0
        for j in range(n_out):
            wj = wa + j * k_dim * 2
            for r in range(0, by4, 4):
                _bf16_4(xa + r * k_dim * 4, k_dim, wj, chunks, ya + (r * n_out + j) * 4, n_out)
            for r in range(by4, by2, 2):
                _bf16_2(xa + r * k_dim * 4, k_dim, wj, chunks, ya + (r * n_out + j) * 4, n_out)
            for r in range(by2, n):
                _bf16_1(xa + r * k_dim * 4, k_dim, wj, chunks, ya + (r * n_out + j) * 4, n_out)
            for r in range(n):
                s = y[r, j]
                for k in range(chunks * LANES, k_dim):  # no fast-math: one multiply, one add, in this order
                    s = s + x[r, k] * widen_bf16(w[j, k])
                y[r, j] = s

    @njit(cache=True, nogil=True, boundscheck=False)
    def dot_fp16(x, w, y, block):  # pragma: no cover - compiled
        """:func:`dot_bf16` for float16 weights (``w``: ``uint16`` holding float16 bits)."""
        n, k_dim = x.shape
        n_out = w.shape[0]
        chunks = k_dim // LANES
        xa, wa, ya = x.ctypes.data, w.ctypes.data, y.ctypes.data
        by4 = n - n % 4 if block == 4 else 0
        by2 = by4 + (n - by4) - (n - by4) % 2 if block >= 2 else 0
        for j in range(n_out):
            wj = wa + j * k_dim * 2
            for r in range(0, by4, 4):
                _fp16_4(xa + r * k_dim * 4, k_dim, wj, chunks, ya + (r * n_out + j) * 4, n_out)
            for r in range(by4, by2, 2):
                _fp16_2(xa + r * k_dim * 4, k_dim, wj, chunks, ya + (r * n_out + j) * 4, n_out)
            for r in range(by2, n):
                _fp16_1(xa + r * k_dim * 4, k_dim, wj, chunks, ya + (r * n_out + j) * 4, n_out)
            for r in range(n):
                s = y[r, j]
                for k in range(chunks * LANES, k_dim):
                    s = s + x[r, k] * widen_fp16(w[j, k])
                y[r, j] = s

    KERNELS = {"bf16": dot_bf16, "fp16": dot_fp16}
else:  # pragma: no cover
    KERNELS = {}


def warm_up() -> threading.Thread | None:
    """Load both compiled kernels in a background thread (numba's first call in a process costs ~0.4 s even from
    its on-disk cache), overlapping the model's loading."""
    if not COMPILED:
        return None

    def first_call():
        x, y = np.zeros((1, LANES + 1), np.float32), np.empty((1, 1), np.float32)
        for kernel in KERNELS.values():
            kernel(x, np.zeros((1, LANES + 1), np.uint16), y, 1)

    thread = threading.Thread(target=first_call, name="specdec-dot16-warm-up", daemon=True)
    thread.start()
    return thread
