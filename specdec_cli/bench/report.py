"""Tables and plots of a record."""

from __future__ import annotations

import sys

from ..errors import SpecdecError
from .config import upgraded_config
from .guard import auto_guard, guard_text

# --- output -----------------------------------------------------------------------------------------------------

COLUMNS = ["method", "tok/s", "ms/tok", "speedup", "acc.len", "sigma", "eta", "draft ms/step", "lossless"]


def fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def lossless_cell(result: dict) -> str:
    if result["lossless"] is None:
        return "n/a (sampled)"
    n = result["generations"]
    others = "".join(f", ={ref} {result[f'identical_to_{ref}']}/{n}" for ref in ("ar", "vllm")
                     if result.get(f"identical_to_{ref}") is not None)
    if result["lossless"]:
        return f"yes {n}/{n}{others}"
    first = result["mismatches"][0]
    return f"NO {result['identical']}/{n} (first: {first['prompt_id']} t{first['turn']} @{first['first_divergence']})" \
        + others


def extra_references(record: dict) -> list[str]:
    """The plain decodings other than the baseline that the run also holds (a column of speedups each)."""
    return [ref for ref in ("ar", "vllm") if any(r.get(f"speedup_vs_{ref}") is not None for r in record["results"])]


def columns(record: dict) -> list[str]:
    base = record.get("baseline", "ar")
    head = ["method"] + (["engine"] if any("@" in r["method"] for r in record["results"]) or base != "ar" else [])
    return head + ["tok/s", "ms/tok", "speedup" if base == "ar" else f"x {base}",
                   *[f"x {ref}" for ref in extra_references(record)], *COLUMNS[4:]]


def table_rows(record: dict) -> list[list[str]]:
    engine = "engine" in columns(record)
    rows = []
    for r in record["results"]:
        row = [r["method"]] + ([r.get("engine") or "specdec"] if engine else [])
        row += [fmt(r["tokens_per_s"], ".1f"), fmt(r["mean_token_ms"], ".2f"), fmt(r["speedup"], ".2f") + "x"]
        row += [fmt(r.get(f"speedup_vs_{ref}"), ".2f") + "x" for ref in extra_references(record)]
        row += [fmt(r["mean_accepted_length"], ".2f"), fmt(r["sigma"], ".2f"), fmt(r["eta"], ".2f"),
                fmt(r["draft_ms_per_step"], ".2f"), lossless_cell(r)]
        rows.append(row)
    return rows


def title(record: dict) -> str:
    cfg = upgraded_config(record["config"])  # a /1 record (bench-merge of old shards) reads the same
    settings, temperature = cfg["settings"], cfg["settings"]["sampling"]["temperature"]
    return (f"{cfg['model']} | {record['prompt_set']} ({record['num_prompts']} prompts) | "
            f"max_new_tokens={settings['max_new_tokens']} | {'greedy' if temperature == 0 else 'T=' + str(temperature)}"
            f" | {record['machine']['device']}")


def source_lines(record: dict) -> list[str]:
    """One line per method that drafts from several sources (auto): accepted tokens per source."""
    out = []
    for r in record["results"]:
        if r.get("sources"):
            parts = [f"{name} {row['accepted']}/{row['verified']}" + (f" (gated {row['gated_steps']})"
                                                                      if row.get("gated_steps") else "")
                     for name, row in r["sources"].items()]
            out.append(f"{r['method']} accepted/verified by source: {', '.join(parts)}")
    return out


def guard_line(record: dict) -> str | None:
    """The guard's line (docs/bench.md): recomputed for records written before it existed."""
    guard = record["auto_guard"] if "auto_guard" in record else auto_guard(record.get("results") or [])
    return guard_text(guard)


def plain_table(record: dict) -> str:
    """Aligned plain text (for pipes, logs and cron mail)."""
    rows = [columns(record)] + table_rows(record)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [title(record)] + ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines += source_lines(record)
    if guard_line(record):
        lines.append(guard_line(record))
    if record.get("note"):
        lines.append(f"note: {record['note']}")
    return "\n".join(lines)


def print_table(record: dict, terminal: bool, file=None) -> None:
    """A rich table on a terminal, plain aligned text otherwise."""
    file = file or sys.stdout
    if not terminal:
        print(plain_table(record), file=file)
        return
    from rich.console import Console
    from rich.table import Table

    from rich import box

    rows, cols = table_rows(record), columns(record)
    table = Table(title=title(record), box=box.SIMPLE_HEAD, pad_edge=False)
    for i, col in enumerate(cols):
        # headers may wrap at spaces; cells never get cut
        width = max([len(row[i]) for row in rows] + [len(word) for word in col.split()])
        table.add_column(col, justify="left" if i in (0, len(cols) - 1) or col == "engine" else "right",
                         min_width=width)
    for row in rows:
        style = "red" if row[-1].startswith("NO") else None
        table.add_row(*row, style=style)
    console = Console(file=file, force_terminal=True)
    console.print(table)
    for line in source_lines(record):
        console.print(line)
    line = guard_line(record)
    if line:
        console.print(line, style="bold red" if line.startswith("WARNING") else None, markup=False)
    if record.get("note"):
        console.print(f"note: {record['note']}")


def comparison_text(findings: list[dict], tolerance: float) -> str:
    lines = [f"compare (tolerance {tolerance:.0%}):"]
    for f in findings:
        detail = "; ".join(f["reasons"]) or (
            "no earlier record" if f["status"] == "new" else
            f"speedup {fmt(f['old_speedup'], '.2f')} -> {fmt(f['new_speedup'], '.2f')}")
        lines.append(f"  {f['method']:<12} {f['status'].upper():<10} {detail}")
    return "\n".join(lines)


def check_plot_path(path: str) -> None:
    """Before a run: ``--plot`` can be written (a folder that exists, a file that is not a folder) and matplotlib
    is there -- so a bad path never costs a finished benchmark."""
    import importlib.util
    import os
    from pathlib import Path

    target = Path(path)
    if target.is_dir():
        raise SpecdecError(f"--plot {path} is a directory")
    if target.exists() and (not target.is_file() or not os.access(target, os.W_OK)):
        raise SpecdecError(f"cannot write --plot {path}: not a writable file")
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        raise SpecdecError(f"cannot write --plot {path}: no such directory {parent}")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise SpecdecError(f"cannot write --plot {path}: permission denied")
    if importlib.util.find_spec("matplotlib") is None:
        raise SpecdecError("--plot needs matplotlib (pip install matplotlib)")


def plot_speedups(record: dict, path: str) -> None:
    """A PNG bar chart of speedups vs ar (matplotlib's Agg backend: no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = [r["method"] for r in record["results"]]
    speedups = [r["speedup"] or 0.0 for r in record["results"]]
    colors = ["#999999" if m == "ar" else ("#d62728" if r["lossless"] is False else "#1f77b4")
              for m, r in zip(methods, record["results"])]
    fig, ax = plt.subplots(figsize=(max(4.0, 1.1 * len(methods) + 1), 3.6))
    bars = ax.bar(methods, speedups, color=colors)
    ax.bar_label(bars, labels=[f"{s:.2f}x" for s in speedups], fontsize=8)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_ylabel("speedup vs ar (tokens/s ratio)")
    ax.set_title(title(record), fontsize=8)
    fig.tight_layout()
    try:
        fig.savefig(path, format="png", dpi=120)
    except OSError as err:
        raise SpecdecError(f"cannot write --plot {path}: {err.strerror or err}") from None
    finally:
        plt.close(fig)
