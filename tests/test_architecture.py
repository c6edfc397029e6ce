"""The shape of the code: no import cycles (dynamic imports included) and no oversized source file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 360  # "no source file over ~350 lines"


def test_no_import_cycles():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "import_graph.py")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "no import cycles" in proc.stderr


def test_no_oversized_modules():
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in (ROOT / "specdec_cli").rglob("*.py")}
    assert {p: n for p, n in sizes.items() if n > MAX_LINES} == {}


def test_commands_do_not_import_the_app():
    """Commands share helpers through commands/common.py; only cli.py builds the app (no hidden cycle)."""
    for path in (ROOT / "specdec_cli" / "commands").glob("*.py"):
        assert "from ..cli import" not in path.read_text(), path
