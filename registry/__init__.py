"""An object-store-backed artifact registry for ML model directories."""

from __future__ import annotations

from registry.commit import DirectoryWriter, commit_local_directory, delete_directory
from registry.manifest import FileEntry, Manifest, build_manifest, parse_manifest
from registry.store import Store, open_store
from registry.verify import VerifyReport, is_committed, verify_directory

__version__ = "0.1.0"

__all__ = [
    "DirectoryWriter",
    "FileEntry",
    "Manifest",
    "Store",
    "VerifyReport",
    "build_manifest",
    "commit_local_directory",
    "delete_directory",
    "is_committed",
    "open_store",
    "parse_manifest",
    "verify_directory",
]
