"""``modeldir_registry``: the import name that does not collide on PyPI (issue 33 item 1).

The package is still written as :mod:`registry` (the name another PyPI project,
a Windows registry library, also installs). This alias makes every module
importable under the new name as the *same* module object, so both spellings
can be mixed in one process::

    import modeldir_registry
    from modeldir_registry.store import open_store      # is registry.store.open_store

Nothing is copied: ``modeldir_registry.X`` is ``sys.modules["registry.X"]``.
The plan (docs/decisions.md): next round the code moves to ``modeldir_registry``
and ``registry`` becomes the deprecated alias, for one release.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType

import registry
from registry import *  # noqa: F403 - the public API, under the new name
from registry import __all__, __version__  # noqa: F401

_NEW, _OLD = __name__, "registry"


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``modeldir_registry.<sub>`` and answers with ``registry.<sub>`` itself."""

    def find_spec(self, name: str, path: object = None,
                  target: object = None) -> importlib.machinery.ModuleSpec | None:
        if not name.startswith(_NEW + "."):
            return None
        old = _OLD + name[len(_NEW):]
        if importlib.util.find_spec(old) is None:
            return None
        return importlib.util.spec_from_loader(name, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(_OLD + spec.name[len(_NEW):])

    def exec_module(self, module: ModuleType) -> None:
        """The module ran when ``registry.<sub>`` was imported."""


if not any(isinstance(f, _Alias) for f in sys.meta_path):
    sys.meta_path.insert(0, _Alias())
__path__: list[str] = []  # a package, so that submodules are looked up (by _Alias)
del registry
