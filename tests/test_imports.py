"""The house: which modules the code imports, read from the code itself (issue 33 item 5)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import registry

ROOT = Path(registry.__file__).resolve().parent


def _run(code: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT.parent)}
    return subprocess.run([sys.executable, "-c", code], env=env, check=True,
                          capture_output=True, text=True).stdout


def test_pull_imports_nothing_of_the_release_builder():
    # A serving host pulls; it must not load the code that builds releases. A fresh
    # interpreter imports every module of registry.pull and lists what came with them.
    out = _run("import json, pkgutil, importlib, sys, registry.pull as p\n"
               "for m in pkgutil.walk_packages(p.__path__, 'registry.pull.'):\n"
               "    importlib.import_module(m.name)\n"
               "print(json.dumps(sorted(sys.modules)))")
    loaded = json.loads(out)
    assert "registry.pull.download" in loaded  # the walk did import the package
    assert [m for m in loaded if m == "registry.release" or m.startswith("registry.release.")] == []


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """module -> the package's modules it imports, read with ``ast`` from every
    file under ``root``: top-level, lazy (inside functions) and type-only
    (``if TYPE_CHECKING:``) imports alike. ``from P import name`` counts as an
    import of ``P.name`` when that is a module, else of ``P``."""
    files = {_module_name(p, root): p for p in root.rglob("*.py")}

    def owner(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        deps: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                deps.update(owner(a.name) for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                for a in node.names:
                    full = f"{base}.{a.name}"
                    deps.add(full if full in files else owner(base))
        graph[mod] = {d for d in deps if d and d != mod}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_package_has_no_import_cycle():
    graph = import_graph()
    assert len(graph) > 50 and "registry.store.s3probe" in graph["registry.store.s3"]
    found = cycles(graph)
    assert found == [], "import cycles: " + "; ".join(
        " <-> ".join(c) + " (" + ", ".join(f"{m} imports {sorted(graph[m] & set(c))}"
                                           for m in c) + ")" for c in found)


def test_the_cycle_finder_sees_lazy_and_type_only_imports(tmp_path: Path):
    # The check above must not pass just because the finder misses a kind of import.
    pkg = tmp_path / "registry"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from registry.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from registry import c\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\n"
                              "if TYPE_CHECKING:\n    from registry.a import X\n")
    (pkg / "d.py").write_text("from .sub.b import f\n")
    graph = import_graph(pkg)
    assert graph["registry.d"] == {"registry.sub.b"}
    assert cycles(graph) == [["registry.a", "registry.c", "registry.sub.b"]]


def _defined_names(path: Path) -> set[str]:
    """Names a module binds at its top level (functions, classes, assignments,
    imports, ``__all__``), read with ``ast``; ``if``/``try`` blocks included."""
    names: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, (ast.If, ast.Try, ast.With, ast.For)):
                visit(node.body)
                visit(getattr(node, "orelse", []))
                for h in getattr(node, "handlers", []):
                    visit(h.body)
                visit(getattr(node, "finalbody", []))
    visit(ast.parse(path.read_text()).body)
    return names


def missing_names(root: Path, importers: list[Path]) -> list[str]:
    """``file:line: from M import N`` for every import in ``importers`` (lazy ones
    too) of a name the package's module ``M`` does not bind and that is no
    submodule of ``M``: what a module move leaves behind in code that runs late."""
    files = {_module_name(p, root): p for p in root.rglob("*.py")}
    defined: dict[str, set[str]] = {}
    out = []
    for path in importers:
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(node, ast.ImportFrom) or node.level or not node.module:
                continue
            if node.module != root.name and not node.module.startswith(root.name + "."):
                continue
            if node.module not in files:
                out.append(f"{path}:{node.lineno}: no module {node.module}")
                continue
            have = defined.setdefault(node.module, _defined_names(files[node.module]))
            for a in node.names:
                if a.name != "*" and a.name not in have and f"{node.module}.{a.name}" not in files:
                    out.append(f"{path}:{node.lineno}: from {node.module} import {a.name}")
    return out


def test_every_imported_name_exists():
    here = Path(__file__).resolve().parent
    importers = sorted(ROOT.rglob("*.py")) + sorted(here.rglob("*.py")) + sorted(
        (ROOT.parent / "bench").glob("*.py"))
    assert missing_names(ROOT, importers) == []


def test_the_name_check_sees_a_lazy_import_of_a_moved_name(tmp_path: Path):
    # a made-up package: "pubkeys" is no module of the real one (the house move
    # rewrites real module names everywhere, strings included)
    pkg = tmp_path / "registry"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "pubkeys.py").write_text("def load_public_key(): ...\nif True:\n    TRUST = 1\n")
    user = pkg / "user.py"
    user.write_text("from registry.pubkeys import TRUST, load_public_key\n"
                    "def f():\n    from registry.pubkeys import load_trust\n"
                    "    from registry.signing import x\n")
    assert missing_names(pkg, [user]) == [f"{user}:3: from registry.pubkeys import load_trust",
                                          f"{user}:4: no module registry.signing"]


def test_package_names_load_on_first_use_and_all_resolve():
    # registry.host.lazy: `import registry` (and the two lazy subpackages) load none
    # of what they export; every exported name then resolves to its module's.
    out = _run("import json, sys, importlib, registry, registry.checkpoint, registry.release\n"
               "before = sorted(m for m in sys.modules if m.startswith(('registry.', 'numpy')))\n"
               "ok = all(getattr(p, n) is getattr(importlib.import_module(p.__name__), n)\n"
               "         for p in (registry, registry.checkpoint, registry.release)\n"
               "         for n in p.__all__)\n"
               "print(json.dumps([before, ok, sorted(registry.checkpoint.__all__)]))")
    before, ok, names = json.loads(out)
    want = {"registry.checkpoint", "registry.host.lazy", "registry.release"}
    want |= {m.rpartition(".")[0] for m in want if m.count(".") > 1}  # a room of lazy's
    assert before == sorted(want), before
    assert ok and "CheckpointManager" in names and "run_root" in names
