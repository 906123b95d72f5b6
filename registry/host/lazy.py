"""Package attributes loaded on first use (PEP 562), so that importing one
submodule does not import the whole package.

A command line call starts a fresh interpreter: ``registry ls`` should not pay
for the checkpoint writer, the release builder and numpy because
``registry/__init__.py`` names them. A package lists what it exports and from
where; :func:`exports` gives it the module ``__getattr__``, ``__dir__`` and
``__all__``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def exports(package: str, modules: Mapping[str, Iterable[str]]) -> tuple[
        Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """``(__getattr__, __dir__, __all__)`` for ``package``, which exports each
    name of ``modules[m]`` from module ``m``: imported when first asked for,
    then kept in the package's namespace.

    Raises (from the returned ``__getattr__``):
        AttributeError: ``name`` is not exported (and is not a loaded submodule).
    """
    names = {name: module for module, exported in modules.items() for name in exported}

    def __getattr__(name: str) -> Any:
        source = names.get(name)
        if source is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(source), name)
        setattr(importlib.import_module(package), name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(importlib.import_module(package))) | set(names))

    return __getattr__, __dir__, sorted(names)
