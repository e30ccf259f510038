"""core/ imports nothing outside the standard library (README.md, Layout: the standard library only)."""

import ast
import subprocess
import sys
from pathlib import Path

CORE = Path(__file__).resolve().parents[1] / "core"


def _root(module: str) -> str:
    """A module's top-level package; for Headroom's own, its sub-package (``headroom.core``)."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "headroom" else parts[0]


def _imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            roots.update(_root(alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            roots.add(_root(node.module))
    return roots


def test_core_sources_import_only_stdlib_and_core():
    files = sorted(CORE.rglob("*.py"))
    assert files, "core/ has no modules"
    for path in files:
        foreign = _imported_roots(path) - set(sys.stdlib_module_names) - {"headroom.core", "__future__"}
        assert not foreign, f"{path.name} imports {sorted(foreign)}"


def test_importing_all_of_core_loads_no_third_party_module():
    modules = " ".join(
        "headroom." + ".".join(p.relative_to(CORE.parent).with_suffix("").parts).removesuffix(".__init__")
        for p in CORE.rglob("*.py")
    )
    code = (
        f"import importlib, sys\nfor m in '{modules}'.split(): importlib.import_module(m)\n"
        "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('torch', 'sqlalchemy', 'streamlit', 'pandas', 'numpy', 'altair'))))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == ""


def test_the_dashboard_never_imports_torch_or_the_agent():
    """A planner's laptop needs no torch."""
    dashboard = CORE.parent / "dashboard"
    for path in sorted(dashboard.rglob("*.py")):
        imported = _imported_roots(path)
        banned = imported & {"torch", "headroom.agent"}
        assert not banned, f"{path.relative_to(dashboard.parent)} imports {sorted(banned)}"
    code = "import sys, headroom.dashboard.planning, headroom.dashboard.plan_tables, headroom.dashboard.data, headroom.dashboard.charts; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
