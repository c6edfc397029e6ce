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

The package: ``config`` (BenchConfig, Generation, the record schema), ``labels`` (method labels, NAME@ENGINE),
``baselines`` (the registry of outside baselines: transformers' in ``hf``, llama.cpp's in ``llama_cpp``),
``runners`` (ours, the interleaved run, ``benchmark``), ``metrics`` (one definition of each metric, from
:mod:`specdec_cli.engine.metrics`), ``records`` (the JSONL record, shard merging), ``history`` (``--out``, reading record files, ``--compare``) and
``report`` (tables and plots).
"""

import importlib

# name -> the submodule defining it: imported on first use, so that the torch-free parts (baselines, labels,
# config, checkpoint) serve --help and the argument checks without importing the runners (torch)
_WHERE = {"load_prompts": "..io.prompts",
          **dict.fromkeys(("RECORD_SCHEMA", "REGRESSION_EXIT_CODE", "BenchConfig", "Generation", "Runner"),
                          ".config"),
          "method_list": ".labels",
          **dict.fromkeys(("first_divergence", "identity_check", "summarize", "summarize_method"), ".metrics"),
          **dict.fromkeys(("append_record", "check_out_file", "compare", "has_regression", "read_records",
                           "record_problem"), ".history"),
          **dict.fromkeys(("make_record", "merge_records"), ".records"),
          **dict.fromkeys(("check_plot_path", "comparison_text", "plot_speedups", "print_table"), ".report"),
          **dict.fromkeys(("benchmark", "datastore_for", "make_runner", "rotated", "run_generations"), ".runners")}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name], __name__), name)
