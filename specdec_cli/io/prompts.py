"""Prompts to benchmark on: the named sets (:mod:`.prompt_sets`), a user's JSONL file, filtered and cut.

``NAME*K`` repeats each prompt of a named set K times in a row (repeated / agentic workloads).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from ..errors import SpecdecError
from .prompt_sets import (Prompt, read_jsonl, load_alpaca, load_alpaca_sample, load_gsm8k, load_gsm8k_sample, load_humaneval,
                          load_long_edit, load_mt_bench, load_rag, load_wide, load_wide_heldout)

__all__ = ["Prompt", "PROMPT_SETS", "load_jsonl_file", "load_prompts"]

PROMPT_SETS: dict[str, Callable[[], list[Prompt]]] = {
    "mt-bench": load_mt_bench,
    "humaneval": load_humaneval,
    "gsm8k": load_gsm8k,
    "alpaca": load_alpaca,
    "rag": load_rag,
    "long-edit": load_long_edit,
    "gsm8k-sample": load_gsm8k_sample,
    "alpaca-sample": load_alpaca_sample,
    "wide": load_wide,
    "wide-heldout": load_wide_heldout,
}



# --- user files -------------------------------------------------------------------------------------------------


def load_jsonl_file(path: str) -> list[Prompt]:
    """A user prompt file: one JSON object per line with ``turns`` (list) or ``prompt``/``text``/``question``
    (string); optional ``id``, ``category`` and ``raw``."""
    prompts = []
    for i, row in enumerate(read_jsonl(Path(path))):
        turns = row.get("turns") or [row.get("prompt") or row.get("text") or row.get("question") or ""]
        if not isinstance(turns, list) or not all(isinstance(t, str) and t.strip() for t in turns):
            raise SpecdecError(f"{path}: line {i + 1} needs 'turns' (list of strings) or a 'prompt' string")
        prompts.append(Prompt(str(row.get("id", f"{Path(path).stem}/{i}")), str(row.get("category", "default")),
                              turns, bool(row.get("raw", False))))
    if not prompts:
        raise SpecdecError(f"prompt file {path} holds no prompts")
    return prompts


def load_prompts(name: str, limit: int | None = None, category: str | None = None, offset: int = 0) -> list[Prompt]:
    """Prompts of a named set (or a ``.jsonl`` path): filtered by ``category``, then ``offset`` skipped, then cut
    to ``limit``."""
    base, _, times = name.rpartition("*")
    if "*" in name and times.isdigit() and int(times) >= 1 and base in PROMPT_SETS:
        # NAME*K: each prompt K times in a row (repeated / agentic workloads); --limit counts distinct prompts
        prompts = load_prompts(base, limit, category, offset)
        return [Prompt(f"{p.id}#{k + 1}", p.category, p.turns, p.raw) for p in prompts for k in range(int(times))]
    if name in PROMPT_SETS:
        prompts = PROMPT_SETS[name]()
    elif name.endswith((".jsonl", ".jsonl.gz")) or Path(name).is_file():
        prompts = load_jsonl_file(name)
    else:
        raise SpecdecError(f"unknown prompt set {name!r}; choose {', '.join(PROMPT_SETS)} or a .jsonl file")
    if category:
        known = sorted({p.category for p in prompts})
        prompts = [p for p in prompts if p.category == category]
        if not prompts:
            raise SpecdecError(f"no prompts of category {category!r} in {name}; categories: {', '.join(known)}")
    if offset < 0 or offset >= len(prompts):
        raise SpecdecError(f"--offset must be in [0, {len(prompts)}) for {name}, got {offset}")
    prompts = prompts[offset:]
    if limit is not None:
        if limit < 1:
            raise SpecdecError(f"--limit must be >= 1, got {limit}")
        prompts = prompts[:limit]
    return prompts
