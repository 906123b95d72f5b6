"""An object-store-backed artifact registry for ML model directories.

The names below load on first use (:mod:`registry.host.lazy`): ``import registry``
costs almost nothing, and a command imports only what it runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from registry.host.lazy import exports

if TYPE_CHECKING:
    from registry.protocol.commit import DirectoryWriter, commit_local_directory, delete_directory
    from registry.protocol.manifest import FileEntry, Manifest, build_manifest, parse_manifest
    from registry.store import Store, open_store
    from registry.protocol.verify import VerifyReport, is_committed, verify_directory

__version__ = "0.1.0"

__getattr__, __dir__, __all__ = exports(__name__, {
    "registry.protocol.commit": ("DirectoryWriter", "commit_local_directory", "delete_directory"),
    "registry.protocol.manifest": ("FileEntry", "Manifest", "build_manifest", "parse_manifest"),
    "registry.store": ("Store", "open_store"),
    "registry.protocol.verify": ("VerifyReport", "is_committed", "verify_directory"),
})
