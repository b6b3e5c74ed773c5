"""The house rules, checked: the serve path imports no torch, matplotlib, exporter, benchmark or test code; imports
run one way (no cycles; models/ and streams/ never import edge_app; exporter never imports edge_app); modules stay
around 500 lines, serve-path modules 300 and serve-path functions around 60; aiortc's and aioice's private names are
read in one adapter; the data channel's message types are spelled in one protocol module."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("edge_app", "models", "streams", "exporter")
SERVE_PATH = [p for p in (REPO / "edge_app").rglob("*.py") if "bench" not in p.parts] + list(
    (REPO / "models").glob("*.py")) + list((REPO / "streams").glob("*.py"))
MAX_MODULE_LINES = 560
MAX_SERVE_MODULE_LINES = 300
MAX_FUNCTION_LINES = 70
ADAPTER = REPO / "streams" / "aiortc_adapter.py"
# The adapter holds every read of aiortc's private state (and nothing else): split, the privates would spread again
MAX_ADAPTER_LINES = 400
PROTOCOL = REPO / "edge_app" / "protocol.py"
MESSAGE_TYPES = {"result", "ping", "pong", "source", "uplink", "model", "video", "error"}


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


def every_import(path: Path) -> set[str]:
    """Project modules imported anywhere in the module, function-level (lazy) imports included, and the modules
    named by ``from PACKAGE import module``."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
    return {m for m in out if m.split(".")[0] in PACKAGES}


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")}


def test_the_serve_path_imports_no_tools_torch_or_plots() -> None:
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", "import edge_app.doors.server, edge_app.hub"],
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
    # no cycle, lazy imports included: a function-level import that closes a circle only hides it until it runs
    lazy = {m: {i for i in every_import(p) if i in modules and i != m} for m, p in modules.items()}
    for g in (graph, lazy):
        assert_no_cycle(g)


def assert_no_cycle(graph: dict[str, set[str]]) -> None:
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


def test_the_cycle_check_sees_a_lazy_import() -> None:
    """A circle closed by a function-level import (as control and control_teach once were) is found."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        a, b = Path(tmp) / "a.py", Path(tmp) / "b.py"
        a.write_text("from edge_app import b\n")
        b.write_text("def f():\n    from edge_app import a\n")
        graph = {"edge_app.a": every_import(a) & {"edge_app.b"}, "edge_app.b": every_import(b) & {"edge_app.a"}}
    try:
        assert_no_cycle(graph)
    except AssertionError as exc:
        assert "edge_app.a -> edge_app.b -> edge_app.a" in str(exc)
    else:
        raise AssertionError("the lazy circle was not found")


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


def test_serve_path_modules_stay_under_300_lines() -> None:
    long = {module_name(p): n for p in SERVE_PATH if (n := len(p.read_text().splitlines())) > (
        MAX_ADAPTER_LINES if p == ADAPTER else MAX_SERVE_MODULE_LINES)}
    assert long == {}, long


def _imports_webrtc(tree: ast.Module) -> bool:
    for node in ast.walk(tree):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
            [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        if any(n.split(".")[0] in ("aiortc", "aioice") for n in names):
            return True
    return False


def _private_reads(tree: ast.Module) -> set[str]:
    """``obj._name`` on anything but ``self``/``cls``, and name-mangled strings (``"_RTCRtpSender__rtt"``)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__") and not (
                isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            found.add(node.attr)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("_RTC"):
            found.add(node.value)
    return found


def test_aiortc_private_names_are_read_only_in_the_adapter() -> None:
    adapter_names = _private_reads(ast.parse(ADAPTER.read_text()))
    assert adapter_names, "the adapter reads aiortc's private state: this check must see it"
    offenders = {}
    for p in all_modules().values():
        if p == ADAPTER or p.parts[len(REPO.parts)] == "exporter":
            continue
        tree = ast.parse(p.read_text())
        text = p.read_text()
        named = {n for n in adapter_names if re.search(rf"\b{re.escape(n)}\b", text)}  # a name the adapter reads
        privates = _private_reads(tree) if _imports_webrtc(tree) else set()
        if named or privates:
            offenders[module_name(p)] = sorted(named | privates)
    assert offenders == {}, offenders


def _spells_a_message_type(tree: ast.Module) -> list[int]:
    def is_type_key(n: ast.AST) -> bool:
        return (isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant) and n.slice.value == "type") or (
            isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "get" and n.args
            and isinstance(n.args[0], ast.Constant) and n.args[0].value == "type")

    def is_message_type(n: ast.AST) -> bool:
        return isinstance(n, ast.Constant) and n.value in MESSAGE_TYPES

    lines = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == "TYPE" for t in targets) and is_message_type(
                getattr(node, "value", None)):
            lines.append(node.lineno)
        if isinstance(node, ast.Dict) and any(isinstance(k, ast.Constant) and k.value == "type" and is_message_type(v)
                                              for k, v in zip(node.keys, node.values, strict=True)):
            lines.append(node.lineno)
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(is_type_key(x) for x in sides) and any(is_message_type(x) for x in sides):
                lines.append(node.lineno)
    return lines


def test_only_the_protocol_module_spells_a_message_type() -> None:
    assert _spells_a_message_type(ast.parse(PROTOCOL.read_text())), "the protocol spells them: this check must see it"
    offenders = {module_name(p): lines for p in all_modules().values()
                 if p != PROTOCOL and (lines := _spells_a_message_type(ast.parse(p.read_text())))}
    assert offenders == {}, offenders
