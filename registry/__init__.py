"""An object-store-backed artifact registry for ML model directories.

The names below load on first use (:mod:`registry.lazy`): ``import registry``
costs almost nothing, and a command imports only what it runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from registry.lazy import exports

if TYPE_CHECKING:
    from registry.commit import DirectoryWriter, commit_local_directory, delete_directory
    from registry.manifest import FileEntry, Manifest, build_manifest, parse_manifest
    from registry.store import Store, open_store
    from registry.verify import VerifyReport, is_committed, verify_directory

__version__ = "0.1.0"

__getattr__, __dir__, __all__ = exports(__name__, {
    "registry.commit": ("DirectoryWriter", "commit_local_directory", "delete_directory"),
    "registry.manifest": ("FileEntry", "Manifest", "build_manifest", "parse_manifest"),
    "registry.store": ("Store", "open_store"),
    "registry.verify": ("VerifyReport", "is_committed", "verify_directory"),
})
