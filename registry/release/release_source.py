"""Publishing a directory that is a release of a store: a release from a release (issue 50).

``registry publish <store>/models/<m>/<v> --model-id M2 --version V2`` makes a
new release out of an existing one. Its source is a release being *read*, so
it is admitted by the one trust function,
:func:`registry.trust.release.open_release`, exactly as a pull admits it:
deleted or yanked, failing its gates now (a revoked data source), rolled back
below this host's marks or the model's signed snapshot, and -- with trusted
keys (``--trusted-key``, ``$REGISTRY_TRUSTED_KEYS``) -- unsigned or signed by
a key this host does not trust or revoked: refused, nothing written. Then
every file of the folder must be one the admitted manifest lists, with its
size and sha256 (read in full), so the bytes released are the admitted ones.
"""

from __future__ import annotations

import os

from registry.errors import IntegrityError
from registry.protocol.layout import MODELS, REFS, release_prefix, tombstone_key
from registry.protocol.manifest import MANIFEST
from registry.rules.names import NAME_RE
from registry.store import Store, join, open_store
from registry.trust import Trust


def release_location(url: str) -> tuple[Store, str, str] | None:
    """``(store, model_id, version)`` when ``url`` is the folder of a release
    (``<root>/models/<model_id>/<version>`` whose MANIFEST.json or tombstone
    exists in the store at ``<root>``), else None."""
    full = url if "://" in url else os.path.abspath(url)
    parts = full.rstrip("/").rsplit("/", 3)
    if len(parts) != 4 or parts[1] != MODELS:
        return None
    root, _, model_id, version = parts
    if version == REFS or not all(NAME_RE.fullmatch(n) for n in (model_id, version)):
        return None
    store = open_store(root or "/")
    if store.exists(join(release_prefix(model_id, version), MANIFEST)) \
            or store.exists(tombstone_key(model_id, version)):
        return store, model_id, version
    return None


def check_release_source(url: str, trust: Trust | None) -> str | None:
    """Admit ``url`` through the trust function when it is a release's folder.

    Returns:
        The admitted manifest's sha256, or None when ``url`` is no release.

    Raises:
        ReleaseDeletedError, ReleaseYankedError, RollbackError,
            SignatureError: see :func:`registry.trust.release.open_release`
            (the signature verified now).
        GateFailedError: the source fails its gates now (a revoked data source).
        IntegrityError: a file of the folder is not in the admitted manifest,
            or a listed one is missing or differs.
    """
    found = release_location(url)
    if found is None:
        return None
    store, model_id, version = found
    from registry.trust.release import open_release
    from registry.protocol.verify import verify_entries

    opened = open_release(store, model_id, version, trust=trust, gates=True, verify="now")
    if opened.failed:
        from registry.errors import GateFailedError
        from registry.release.failing import describe

        raise GateFailedError(f"{url} (the source, {model_id}@{version}, fails its gates "
                              f"now: {describe(opened.failed)})", opened.failed)
    opened.signature_check()
    prefix = opened.prefix
    listed = {e.path for e in opened.manifest.files}
    for rel in sorted(store.walk_files(prefix)):
        if rel != MANIFEST and rel not in listed:
            raise IntegrityError(store.url_of(join(prefix, rel)),
                                 reason=f"not listed in {model_id}@{version}'s MANIFEST.json "
                                        "(a release from a release takes only its files)")
    problems = verify_entries(store, prefix, opened.manifest.files, full=True)
    if problems:
        raise problems[0]
    return opened.manifest.digest


__all__ = ["check_release_source", "release_location"]
