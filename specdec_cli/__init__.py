"""specdec: training-free, lossless speculative decoding for Hugging Face causal LMs."""

__version__ = "0.1.0"

import os as _os
import sys as _sys

# OpenMP's worker threads spin after every parallel region (libgomp: ~300,000 spins) unless told to sleep. The
# register tiles split a product's outputs over torch's threads with threads of their own (runtime/dot.py), and
# on a 2-core machine a spinning OpenMP worker took the core they needed: the kernel plans then measured the split
# tiles 2x slower than alone and never chose them (docs/profiling.md, "A batch's step at two threads"). Sleeping
# workers cost MKL nothing measurable here. Set only where it takes effect (torch, which loads OpenMP, not imported
# yet) and only when the user set nothing; vLLM's engine processes get the variable back as the user had it
# (serving/vllm_engine.py marks it "0", which its spawned processes, importing specdec again, respect).
if "OMP_WAIT_POLICY" not in _os.environ and "torch" not in _sys.modules \
        and _os.environ.get("SPECDEC_SET_OMP_WAIT_POLICY") != "0":
    _os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    _os.environ["SPECDEC_SET_OMP_WAIT_POLICY"] = "1"
