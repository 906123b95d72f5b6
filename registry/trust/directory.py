"""``registry verify --trusted-key``: a committed directory's signature, checked
as pull checks a release's (the one trust path, issue 50).

A directory verifies under trust when its manifest is a release's (it names
a model id and version), its ``model.sig`` verifies for exactly that id and
version under the host's trust (:func:`registry.trust.model_sig.verify_release`),
and, when the directory is a release folder of a store
(``.../models/<model>/<version>``), the folder is named for that same
release: a store writer who copies a signed release under another version is
refused here as pull refuses it.

May import: what registry.trust may (see its package docstring).
"""

from __future__ import annotations

from registry.errors import InvalidNameError, SignatureError
from registry.protocol.manifest import Manifest
from registry.rules.names import model_from_key
from registry.store import Store
from registry.trust import Trust


def folder_release(url: str) -> tuple[str, str] | None:
    """``(model_id, version)`` when ``url`` ends in ``models/<model>/<version>``."""
    parts = url.rstrip("/").split("/")
    if len(parts) < 3 or parts[-3] != "models":
        return None
    try:
        return model_from_key(parts[-2]), parts[-1]
    except InvalidNameError:
        return None


def check_directory_signature(store: Store, manifest: Manifest, trust: Trust) -> str:
    """Verify the signature of the directory at ``store``'s root; returns who
    signed it, in words.

    Raises:
        SignatureError: not a release, unsigned, a folder named for another
            release, or a signature the trust refuses.
        IntegrityError: ``model.sig`` differs from its manifest entry.
    """
    from registry.trust.model_sig import verify_release

    where = store.url
    model_id, version = manifest.meta.get("model_id"), manifest.meta.get("version")
    if manifest.kind != "release" or not isinstance(model_id, str) \
            or not isinstance(version, str):
        raise SignatureError(where, f"a {manifest.kind} manifest names no released model: "
                                    "only releases are signed")
    named = folder_release(where)
    if named is not None and named != (model_id, version):
        raise SignatureError(where, f"the folder is {named[0]}@{named[1]} but its manifest "
                                    f"is {model_id}@{version}'s: a release copied under "
                                    "another name")
    return verify_release(store, "", manifest, model_id=model_id, version=version,
                          trust=trust).describe()


__all__ = ["check_directory_signature", "folder_release"]
