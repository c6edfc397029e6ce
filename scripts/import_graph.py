"""Print specdec_cli's module import graph (every import, top-level or inside functions, and the registry's
dynamic ``importlib.import_module`` of method modules) and exit 1 if it has a cycle or an import that goes up
the layers (:data:`LAYERS`: a module imports only from its own package or from layers below its own).

    python scripts/import_graph.py            # floor list: module -> the specdec modules it imports
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "specdec_cli"
LAYERS = [  # top first; each entry is a module or a package of specdec_cli
    ("cli",),
    ("commands",),
    ("bench",),
    ("api",),
    ("serving",),
    ("methods",),
    ("drafting",),
    ("engine",),
    ("datastore",),
    ("runtime",),
    ("io",),
    ("config", "errors", ""),
]


def layer_of(module: str) -> int:
    """Index of ``module``'s layer in :data:`LAYERS` (0 = top)."""
    name = module.removeprefix("specdec_cli").removeprefix(".")
    head = name.split(".")[0]
    for i, members in enumerate(LAYERS):
        if head in members:
            return i
    raise KeyError(f"{module} is in no layer: add it to LAYERS")


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a module from a layer above its own."""
    return [f"{m} -> {d}" for m in sorted(graph) for d in sorted(graph[m]) if layer_of(d) < layer_of(m)]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def resolve(current: str, is_package: bool, level: int, name: str | None) -> str:
    base = current.split(".")
    if level:
        base = base[: len(base) - level + (1 if is_package else 0)]
    return ".".join(base + ([name] if name else []))


def imports_of(path: Path, modules: set[str]) -> set[str]:
    current, is_package = module_name(path), path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            target = resolve(current, is_package, node.level, node.module)
            subs = {f"{target}.{a.name}" for a in node.names}
            found |= subs & modules
            if subs - modules:  # names defined in the module itself (not only its submodules)
                found.add(target)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module":
            if current == "specdec_cli.methods":  # the registry imports every method module by name
                found |= {m for m in modules if m.startswith("specdec_cli.methods.")}
            else:  # a table of names imported on first use: ".x"/"..x.y" or "module:function" of the package
                found |= named_modules(path, current, is_package)
    return {m for m in found if m in modules and m != current}


def named_modules(path: Path, current: str, is_package: bool) -> set[str]:
    """The modules a lazy table in ``path`` names by string (bench's exports and baselines registry)."""
    package = current if is_package else current.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
            if re.fullmatch(r"\.{1,2}[\w.]+", text):
                level = len(text) - len(text.lstrip("."))
                found.add(resolve(current, is_package, level, text.lstrip(".")))
            elif re.fullmatch(r"\w+:\w+", text):
                found.add(f"{package}.{text.split(':')[0]}")
    return found


def main() -> int:
    files = sorted(ROOT.rglob("*.py"))
    modules = {module_name(f) for f in files}
    graph = {module_name(f): imports_of(f, modules) for f in files}
    for mod in sorted(graph):
        deps = ", ".join(sorted(d.removeprefix("specdec_cli.") for d in graph[mod])) or "-"
        print(f"{mod.removeprefix('specdec_cli.') or 'specdec_cli'}: {deps}")
    # a package importing its own submodules is not a cycle (Python runs __init__ first); anything else is
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for d in graph[m]:
            if d.startswith(m + "."):
                continue
            if state.get(d) == 1 and not m.startswith(d + "."):
                return stack[stack.index(d):] + [d]
            if d not in state:
                cycle = visit(d)
                if cycle:
                    return cycle
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            cycle = visit(m)
            if cycle:
                print("CYCLE: " + " -> ".join(cycle), file=sys.stderr)
                return 1
    print("no import cycles", file=sys.stderr)
    upward = upward_imports(graph)
    for line in upward:
        print(f"UPWARD: {line}", file=sys.stderr)
    if upward:
        return 1
    print("every import goes down the layers", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
