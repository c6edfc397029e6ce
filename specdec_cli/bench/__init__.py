"""``specdec bench``: honest side-by-side benchmarks of decoding methods (library part; the CLI is commands/bench.py).

Honesty rules the code follows (docs/bench.md has the exact metric definitions):

* every method sees the same prompts, the same ``max_new_tokens``, the same stop ids and the same sampling;
* methods are interleaved per prompt, in a rotating order, so slow drifts (thermal throttling, other processes)
  hit every method alike instead of whichever ran last;
* one untimed warm-up generation per method first (allocations, kernel selection, lazy imports);
* the speedup is measured against ``ar`` run in the same process on the same prompts -- never against a number
  from another run; ``ar`` is added when not asked for;
* transformers' own ``generate`` (plain, assisted, prompt lookup) is timed the same way, as an outside baseline;
* greedy outputs are checked token for token against ``ar``'s (the point of *lossless* speculative decoding).

The package: ``config`` (BenchConfig, Generation, the method list), ``runners`` (ours and transformers' baselines,
the interleaved run, ``benchmark``), ``metrics`` (one definition of each metric, from
:mod:`specdec_cli.engine.metrics`), ``records`` (the JSONL record, shard merging), ``history`` (``--out``, reading record files, ``--compare``) and
``report`` (tables and plots).
"""

from ..io.prompts import load_prompts
from .config import HF_BASELINES, RECORD_SCHEMA, REGRESSION_EXIT_CODE, BenchConfig, Generation, Runner, method_list
from .metrics import first_divergence, identity_check, summarize, summarize_method
from .history import append_record, check_out_file, compare, has_regression, read_records, record_problem
from .records import make_record, merge_records
from .report import check_plot_path, comparison_text, plot_speedups, print_table
from .runners import benchmark, datastore_for, make_runner, rotated, run_generations

__all__ = ["HF_BASELINES", "RECORD_SCHEMA", "REGRESSION_EXIT_CODE", "BenchConfig", "Generation", "Runner",
           "append_record", "benchmark", "check_out_file", "check_plot_path", "compare", "comparison_text",
           "datastore_for", "first_divergence", "has_regression", "identity_check", "load_prompts", "make_record",
           "make_runner", "merge_records", "method_list", "plot_speedups", "print_table", "read_records",
           "record_problem", "rotated", "run_generations", "summarize", "summarize_method"]
