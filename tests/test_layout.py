"""The house rules, checked: the serve path imports no torch, matplotlib, exporter, benchmark or test code; imports
run one way (no cycles; models/ and streams/ never import edge_app; exporter never imports edge_app); modules stay
around 500 lines and serve-path functions around 60."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("edge_app", "models", "streams", "exporter")
SERVE_PATH = [p for p in (REPO / "edge_app").glob("*.py")] + list((REPO / "models").glob("*.py")) + list(
    (REPO / "streams").glob("*.py"))
MAX_MODULE_LINES = 560
MAX_FUNCTION_LINES = 70


def module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def top_level_imports(path: Path) -> set[str]:
    """Project modules imported at module level (function-level imports are the lazy ones the CLI uses)."""
    out: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return {m for m in out if m.split(".")[0] in PACKAGES}


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")}


def test_the_serve_path_imports_no_tools_torch_or_plots() -> None:
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", "import edge_app.server, edge_app.hub"],
                          capture_output=True, text=True, cwd=REPO, check=True)
    imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if "|" in line}
    forbidden = sorted(m for m in imported if m.split(".")[0] in ("torch", "torchvision", "matplotlib", "exporter",
                                                                   "tests", "pytest", "playwright")
                       or m.startswith("edge_app.bench"))
    assert forbidden == [], forbidden
    assert "edge_app.hub" in imported and "models.service" in imported


def test_imports_run_one_way_without_cycles() -> None:
    modules = all_modules()
    graph = {m: {i for i in top_level_imports(p) if i in modules} for m, p in modules.items()}
    for m, deps in graph.items():
        top = m.split(".")[0]
        if top in ("models", "streams"):
            assert not any(d.startswith("edge_app") for d in deps), (m, deps)
        if top == "exporter":
            assert not any(d.startswith("edge_app") for d in deps), (m, deps)
        if not m.startswith("edge_app.bench"):
            assert not any(d.startswith("edge_app.bench") for d in deps), (m, deps)
    # every lazy import too: models, streams and exporter never reach edge_app at all
    for m, p in modules.items():
        if m.split(".")[0] in ("models", "streams", "exporter"):
            text = p.read_text()
            assert "from edge_app" not in text and "import edge_app" not in text, m
    seen: dict[str, int] = {}

    def visit(m: str, stack: list[str]) -> None:
        if seen.get(m) == 2:
            return
        assert seen.get(m) != 1, "import cycle: " + " -> ".join([*stack[stack.index(m):], m])
        seen[m] = 1
        for d in sorted(graph[m]):
            visit(d, [*stack, m])
        seen[m] = 2

    for m in sorted(graph):
        visit(m, [])


def test_modules_and_serve_path_functions_stay_small() -> None:
    long_modules = {module_name(p): n for p in REPO.glob("*/**/*.py") if p.parts[len(REPO.parts)] in PACKAGES
                    and (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long_modules == {}, long_modules
    long_functions = []
    for p in SERVE_PATH:
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long_functions.append(f"{module_name(p)}.{node.name}: {n} lines")
    assert long_functions == [], long_functions
