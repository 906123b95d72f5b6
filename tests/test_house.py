"""The house (issue 44 item 7): every concept has its room, and each room says what it
holds and what it may import.

* no module under ``registry/`` is over 500 lines;
* the package root holds only ``__init__``, ``__main__``, ``api`` (the public door)
  and ``errors`` (the one exception hierarchy): everything else lives in a room;
* every room (sub-package) has a docstring, and the docstring names the rooms it may
  import exactly as :data:`MAY_IMPORT` does;
* no room imports a room outside its line of :data:`MAY_IMPORT` (lazy and type-only
  imports count too).

A new import between rooms is a decision: add the room to the importer's line here
and to the line of its ``__init__`` docstring, and say why in docs/architecture.md.
"""

from __future__ import annotations

import ast
from pathlib import Path

import registry

ROOT = Path(registry.__file__).resolve().parent
MAX_LINES = 500
ROOT_MODULES = {"__init__", "__main__", "api", "errors"}
MARKER = "Rooms it may import (tests/test_house.py keeps this list):"

BASE = ['errors', 'host', 'rules', 'obs', 'store', 'protocol', 'formats', 'gating']
MAY_IMPORT: dict[str, list[str]] = {
    'errors': [],
    'host': ['errors'],
    'rules': ['errors', 'host'],
    'obs': ['errors', 'host', 'rules'],
    'store': ['errors', 'host', 'rules', 'obs', 'protocol'],
    'protocol': ['errors', 'host', 'rules', 'obs', 'store'],
    'formats': ['errors', 'host', 'rules', 'obs', 'store', 'protocol'],
    'gating': ['errors', 'host', 'rules', 'obs', 'store', 'protocol', 'formats'],
    'checkpoint': BASE + ['release'],
    'release': BASE + ['checkpoint', 'events', 'lifecycle', 'refs', 'trust'],
    'lifecycle': BASE + ['checkpoint', 'events', 'refs', 'trust'],
    'events': BASE + ['lifecycle', 'refs', 'trust'],
    'refs': BASE + ['events', 'lifecycle', 'trust'],
    'trust': BASE + ['events', 'lifecycle', 'pull', 'refs', 'release'],
    'pull': BASE + ['lifecycle', 'trust'],
    'load': BASE + ['checkpoint', 'pull', 'refs', 'release', 'trust'],
    'index': BASE + ['checkpoint', 'lifecycle', 'refs', 'release'],
    'facade': BASE + ['checkpoint', 'index', 'lifecycle', 'refs', 'release', 'trust'],
    'api': BASE + ['checkpoint', 'events', 'facade', 'index', 'lifecycle', 'load', 'pull', 'refs', 'release', 'trust'],
    'oci': BASE + ['api', 'lifecycle', 'pull', 'release', 'trust'],
    'examples': BASE + ['api', 'checkpoint', 'pull', 'trust'],
    'web': ['*'],
    'cli': ['*'],
}


def _rooms() -> list[str]:
    return sorted(p.parent.name for p in ROOT.glob("*/__init__.py"))


def _room_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "registry" or len(parts) < 2:
        return None
    return parts[1]


def _imports(path: Path) -> set[str]:
    """Modules of the package a file imports, top-level, lazy and type-only alike."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if node.module == "registry":
                out.update(f"registry.{a.name}" for a in node.names)
            else:
                out.add(node.module)
    return {m for m in out if m.startswith("registry.")}


def test_no_module_is_over_500_lines():
    long = sorted(f"{p.relative_to(ROOT.parent)}: {n} lines"
                  for p in ROOT.rglob("*.py")
                  if (n := len(p.read_text().splitlines())) > MAX_LINES)
    assert long == [], "split these by concept: " + "; ".join(long)


def test_the_root_holds_only_the_doors():
    extra = sorted(p.name for p in ROOT.glob("*.py") if p.stem not in ROOT_MODULES)
    assert extra == [], f"modules at the package root, put each in its room: {extra}"


def test_every_room_has_a_docstring_naming_what_it_may_import():
    bad = []
    for room in _rooms():
        doc = ast.get_docstring(ast.parse((ROOT / room / "__init__.py").read_text())) or ""
        if room not in MAY_IMPORT:
            bad.append(f"{room}: not in tests/test_house.py MAY_IMPORT")
            continue
        if len(doc.split()) < 8:
            bad.append(f"{room}: its docstring does not say what the room holds")
        line = " ".join(doc[doc.find(MARKER):].split()) if MARKER in doc else ""
        if not line:
            bad.append(f"{room}: its docstring has no line {MARKER!r}")
            continue
        named = line[len(MARKER):].split(".")[0].strip()  # up to the line's full stop
        want = MAY_IMPORT[room]
        said = ["*"] if named == "any room" else [] if named == "none" else \
            [w.strip() for w in named.split(",")]
        if sorted(said) != sorted(want):
            bad.append(f"{room}: docstring says {said}, the table {want}")
    assert bad == [], "; ".join(bad)


def test_no_room_imports_a_room_it_may_not():
    bad = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        room = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        if room in ("__init__", "__main__"):
            continue
        allowed = MAY_IMPORT.get(room)
        for module in sorted(_imports(path)):
            other = _room_of(module)
            if other is None or other == room or other == "__version__":
                continue
            if allowed is None:
                bad.append(f"registry/{rel}: room {room!r} is not in MAY_IMPORT")
                break
            if allowed != ["*"] and other not in allowed:
                bad.append(f"registry/{rel} imports {module} (room {other!r}); "
                           f"{room!r} may import {allowed}")
    assert bad == [], "\n".join(bad)


def test_the_table_names_only_rooms_that_exist():
    known = set(_rooms()) | {"api", "errors"}
    ghosts = {r for rooms in MAY_IMPORT.values() for r in rooms if r != "*"} - known
    assert ghosts == set(), f"MAY_IMPORT names rooms that are not there: {sorted(ghosts)}"
