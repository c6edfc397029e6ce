"""The 16-bit linear kernels' entry points, and the fixed-order float32 dot products of attention and norms.

* :func:`dot_bf16`, :func:`dot_fp16` -- float32 rows times 16-bit weights (bfloat16 or float16) streamed as stored
  and widened in registers (issue 35: a decoding step reads every weight once, so half the bytes is about half the
  step; PyTorch's own bf16 CPU products for one row stream far below the bound). They run the row-invariant tiles
  of :mod:`specdec_cli.runtime.tiles`; these names and their ``block`` argument are what the compiled layers of
  :mod:`specdec_cli.runtime.fused` and the plans of :mod:`specdec_cli.runtime.kernels16` call.
* ``f32_1``, ``f32_2``, ``f32_4`` -- LLVM intrinsics summing ``q . k`` for 1, 2 or 4 float32 rows against one
  float32 vector in one fixed order (:mod:`specdec_cli.runtime.attend`'s scores, :mod:`~specdec_cli.runtime.fused`'s
  sums of squares). Lane ``l`` of :data:`LANES` accumulates the products of ``k = l, l + LANES, ...`` with fused
  multiply-adds (``llvm.fma``, no fast-math flags, so LLVM may not reorder them), the lanes are added in a fixed
  tree, and the caller adds the ``K mod LANES`` leftovers one by one: every blocking gives every row the same bits.
"""

from __future__ import annotations

import threading

import numpy as np

from .jit import COMPILED, njit

VECTOR = 8  # float32 lanes of one AVX2 register: the width the IR's vectors are written in
ACCUMULATORS = 4  # vectors per row: 4 x 8 = 32 independent sums hide the FMA latency (one row at 1 FMA/cycle)
LANES = VECTOR * ACCUMULATORS
BLOCKS = (1, 2, 4)  # rows per load of the shared vector: 4 rows x 4 accumulators = 16 registers, AVX2's count

if COMPILED:  # pragma: no branch - without numba there is no dot16 (kernels.STRATEGIES leaves it out)
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    from .tiles import BF16, FP16, dot_tiled, fma_sums, lane_tree

    _F32, _I64 = ir.FloatType(), ir.IntType(64)
    _VF = ir.VectorType(_F32, VECTOR)

    def _load_vector(builder, wp, k):
        """8 floats from ``k`` on."""
        return builder.load(builder.bitcast(builder.gep(wp, [k]), _VF.as_pointer()), align=4)

    def _lane_sum(builder, vectors):
        """The fixed reduction of one row's accumulators: (a0 + a1) + (a2 + a3), then the lane tree."""
        pairs = builder.fadd(builder.fadd(vectors[0], vectors[1]), builder.fadd(vectors[2], vectors[3]))
        return lane_tree(builder, pairs)

    def _block(rows: int):
        """An intrinsic ``block(x_addr, x_stride, w_addr, chunks, y_addr, y_stride)``: for ``rows`` float32 rows at
        ``x_addr`` (``x_stride`` floats apart) and one weight row at ``w_addr``, the sums over the first ``chunks *
        LANES`` products, stored at ``y_addr`` (``y_stride`` floats apart)."""

        @intrinsic
        def block(typingctx, x_addr, x_stride, w_addr, chunks, y_addr, y_stride):
            sig = types.void(types.intp, types.intp, types.intp, types.intp, types.intp, types.intp)
            return sig, lambda context, builder, signature, args: _emit(context, builder, args, rows)

        return block

    def _emit(context, builder, args, rows: int):
        x_addr, x_stride, w_addr, chunks, y_addr, y_stride = args
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VF, [_VF] * 3), "llvm.fma.v8f32")
        xp = builder.inttoptr(x_addr, _F32.as_pointer())
        wp = builder.inttoptr(w_addr, _F32.as_pointer())

        def chunk(c, accs):  # LANES products for each row; accumulator r * ACCUMULATORS + v
            new = [None] * (rows * ACCUMULATORS)
            for v in range(ACCUMULATORS):
                k = builder.add(builder.mul(c, ir.Constant(_I64, LANES)), ir.Constant(_I64, VECTOR * v))
                wf = _load_vector(builder, wp, k)
                for r in range(rows):
                    at = builder.add(builder.mul(x_stride, ir.Constant(_I64, r)), k)
                    xv = builder.load(builder.bitcast(builder.gep(xp, [at]), _VF.as_pointer()), align=4)
                    new[r * ACCUMULATORS + v] = builder.call(fma, [xv, wf, accs[r * ACCUMULATORS + v]])
            return new

        flat = fma_sums(builder, chunks, rows * ACCUMULATORS, chunk)
        finals = [flat[r * ACCUMULATORS: (r + 1) * ACCUMULATORS] for r in range(rows)]
        yp = builder.inttoptr(y_addr, _F32.as_pointer())
        for r, vectors in enumerate(finals):
            builder.store(_lane_sum(builder, vectors), builder.gep(yp, [builder.mul(y_stride, ir.Constant(_I64, r))]))
        return context.get_dummy_value()

    f32_1, f32_2, f32_4 = (_block(r) for r in BLOCKS)  # runtime.attend's q . k, runtime.fused's sums of squares

    @njit(cache=True, nogil=True, boundscheck=False)
    def dot_bf16(x, w, y, block):  # pragma: no cover - compiled
        """``y[r, j] = x[r] . bf16(w[j])``: float32 ``x [n, K]``, ``uint16`` ``w [N, K]`` (bfloat16 bits), float32
        ``y [n, N]``, all C-contiguous; ``block``: 1 = one row per tile, 2 or more = row pairs (same bits whichever):
        :func:`specdec_cli.runtime.tiles.dot_tiled`."""
        dot_tiled(x, w, y, BF16, block >= 2)

    @njit(cache=True, nogil=True, boundscheck=False)
    def dot_fp16(x, w, y, block):  # pragma: no cover - compiled
        """:func:`dot_bf16` for float16 weights (``w``: ``uint16`` holding float16 bits)."""
        dot_tiled(x, w, y, FP16, block >= 2)

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
