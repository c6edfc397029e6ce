"""specdec: training-free, lossless speculative decoding for Hugging Face causal LMs."""

__version__ = "0.1.0"

import os as _os
import sys as _sys

# OpenMP's worker threads spin after every parallel region (libgomp: 300,000 pause loops, milliseconds on a CPU
# whose `pause` is slow) before they sleep. The register tiles split a product's outputs over torch's threads with
# threads of their own (runtime/dot.py): on the 2-core VM they were made on, a worker spinning that long took the
# core they needed. Asleep at once (OMP_WAIT_POLICY=PASSIVE, what specdec set before), they made every MKL call
# wake them: on a 2-core Intel Xeon VM batched `ar` at B = 8 lost 27% to that (76 against 105 tok/s with the
# default spin), and one sequence at 2 threads was no faster than at 1. A bounded spin keeps both:
# GOMP_SPINCOUNT=10000 (about 0.5 ms at a Xeon's ~140-cycle `pause`) covers the microseconds between one step's
# products and lets the cores go soon after a step (112 tok/s there; 1,000 spins: 83; 50,000: 115;
# docs/profiling.md, "OpenMP's workers between products"). Set only where it takes effect (torch, which loads
# OpenMP, not imported yet) and only when the user set neither variable; vLLM's engine processes get the
# environment back as the user had it (serving/vllm_engine.py marks it "0", which its spawned processes,
# importing specdec again, respect). The kernel plans and forward-time profiles are keyed by these variables.
OPENMP_SPINS = "10000"
if "OMP_WAIT_POLICY" not in _os.environ and "GOMP_SPINCOUNT" not in _os.environ and "torch" not in _sys.modules \
        and _os.environ.get("SPECDEC_SET_OMP_WAIT_POLICY") != "0":
    _os.environ["GOMP_SPINCOUNT"] = OPENMP_SPINS
    _os.environ["SPECDEC_SET_OMP_WAIT_POLICY"] = "1"
# What OpenMP read (or will read) at torch's import; later changes to the environment (vLLM's processes get the
# user's back) do not reach it. Plans, profiles and bench records are keyed by this, not by the current environment.
OPENMP_ENV = (_os.environ.get("OMP_WAIT_POLICY", "-"), _os.environ.get("GOMP_SPINCOUNT", "-"))
