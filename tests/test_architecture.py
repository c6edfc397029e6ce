"""The shape of the code: layers whose imports only go down (dynamic imports included), no cycles, no module over
300 lines and no function over 60 (numba kernels excepted: a compiled loop is kept whole so numba sees one
function, and splitting it would cost a call per iteration)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_MODULE_LINES = 300
MAX_FUNCTION_LINES = 60
sys.path.insert(0, str(ROOT / "scripts"))

import import_graph  # noqa: E402


def source_files():
    return sorted((ROOT / "specdec_cli").rglob("*.py"))


def test_no_import_cycles_and_layers_go_down():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "import_graph.py")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "no import cycles" in proc.stderr
    assert "every import goes down the layers" in proc.stderr


def test_layering_check_catches_an_upward_import():
    graph = {"specdec_cli.engine.loop": {"specdec_cli.methods.sd"}, "specdec_cli.methods.sd": {"specdec_cli.engine.loop"}}
    assert import_graph.upward_imports(graph) == ["specdec_cli.engine.loop -> specdec_cli.methods.sd"]


def test_every_module_has_a_layer():
    for path in source_files():
        import_graph.layer_of(import_graph.module_name(path))  # KeyError names a module outside the layers


def test_no_oversized_modules():
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in source_files()}
    assert {p: n for p, n in sizes.items() if n > MAX_MODULE_LINES} == {}


def is_numba_kernel(node: ast.FunctionDef) -> bool:
    for deco in node.decorator_list:
        func = deco.func if isinstance(deco, ast.Call) else deco
        if getattr(func, "id", getattr(func, "attr", None)) == "njit":
            return True
    return False


def test_no_long_functions():
    long = {}
    for path in source_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not is_numba_kernel(node):
                size = node.end_lineno - node.lineno + 1
                if size > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(ROOT)}:{node.name}"] = size
    assert long == {}


def test_commands_do_not_import_the_app():
    """Commands share helpers through commands/common.py; only cli.py builds the app (no hidden cycle)."""
    for path in (ROOT / "specdec_cli" / "commands").glob("*.py"):
        assert "from ..cli import" not in path.read_text(), path


def test_every_datastore_kind_names_its_sources():
    """A kind of datastore brings its own draft sources (auto's and the vLLM proposer's): nothing else picks a
    class by kind, so a third kind cannot silently draft through another kind's source."""
    from specdec_cli.datastore import KINDS
    from specdec_cli.drafting.sources import Source

    for kind in KINDS.values():
        assert issubclass(kind.auto_source(), Source) and callable(kind.auto_source().for_store)
        assert kind.chain_source().name
    names = {kind.auto_source() for kind in KINDS.values()}
    assert len(names) == len(KINDS)
    source = (ROOT / "specdec_cli" / "methods" / "auto.py").read_text()
    assert "isinstance(source" not in source and "SUFFIX_ARRAY" not in source
