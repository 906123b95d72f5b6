"""``registry-storage-initializer registry://MODEL@REF DEST``: KServe's storage initializer.

KServe runs a ``ClusterStorageContainer``'s container with two arguments, the
storage URI and the folder the model server reads (``/mnt/models``, an
``emptyDir`` mounted into both containers), and starts the model server only
when it exits 0 (deploy/kserve/). This entry point pulls the release
``MODEL@REF`` (a version or an alias) with :func:`registry.pull.pull` and its
every check: each byte hashed against the manifest, a yanked or deleted
release refused, the release's signature and the alias move checked against
the trusted keys / CAs when ``REGISTRY_TRUSTED_KEYS`` / ``REGISTRY_TRUSTED_CAS``
name them; and before any byte, a release failing its gates now (a revoked
data source, a policy) is refused unless ``REGISTRY_ALLOW_FAILING=1``.

The store is ``REGISTRY_STORE`` (credentials the usual ``AWS_*`` variables).
``DEST`` may be a mount point, so the release is pulled into a staging folder
inside it (same filesystem) and its entries are renamed into ``DEST``; the
staging folder and its private cache are removed afterwards (``REGISTRY_CACHE``
set: that cache is used and kept, e.g. a node's hostPath shared by pods). A
``DEST`` that already holds the release (an init container run again) is
admitted by the trust function as a pull is, then re-hashed and accepted; one
holding anything else is refused.

Exit codes are the CLI's (docs/errors.md): 0 placed, 1 refused (gates, yank,
signature, bytes that differ), 2 bad URI or arguments, 3 no such model or
ref, 6 storage. On failure one line, ``error: <why>``, goes to stderr and to
the container's termination message (``/dev/termination-log``, or
``REGISTRY_TERMINATION_LOG``), which ``kubectl describe`` and KServe show.
"""

from __future__ import annotations

import os
import shutil
import sys
import uuid
from pathlib import Path
from typing import Any

from registry.errors import CommitConflictError, GateFailedError, RegistryError, UsageError

SCHEME = "registry://"
#: the staging folders this entry point makes inside DEST
STAGING_PREFIX = ".registry-init-"
TERMINATION_LOG = "/dev/termination-log"


def parse_uri(uri: str) -> tuple[str, str]:
    """``(model_id, ref)`` of ``registry://MODEL@REF``.

    Raises:
        UsageError: another scheme, or no ``@REF``.
        InvalidNameError: the model id or ref breaks the naming rule.
    """
    from registry.refs.aliases import parse_ref

    if not uri.startswith(SCHEME):
        raise UsageError(f"{uri}: expected a {SCHEME}MODEL@REF URI")
    model_id, ref = parse_ref(uri[len(SCHEME):].rstrip("/"))
    if ref is None:
        raise UsageError(f"{uri}: name the release, {SCHEME}MODEL@VERSION or "
                         f"{SCHEME}MODEL@ALIAS")
    return model_id, ref


def _trust_from_env() -> Any:
    keys, cas = os.environ.get("REGISTRY_TRUSTED_KEYS"), os.environ.get("REGISTRY_TRUSTED_CAS")
    if not keys and not cas:
        return None
    from registry.trust import load_trust

    return load_trust([], keys or None, ca_folder=cas or None)


def initialize(uri: str, dest: str | os.PathLike[str], *, store: str | None = None,
               trust: Any = None, allow_failing: bool = False,
               cache: str | None = None) -> dict[str, Any]:
    """Place the release ``uri`` names in ``dest``, verified (the module docstring).

    Args:
        uri: ``registry://MODEL@REF``.
        dest: the folder the model server reads (created if absent).
        store: the store URL (default ``$REGISTRY_STORE``).
        trust: a registry.trust.Trust every release must be signed under, or None.
        allow_failing: place a release that fails its gates now.
        cache: a pull cache to use and keep (default: a private one, removed).

    Returns:
        The pull's result document (registry.pull.PullResult.to_dict) with
        ``path`` set to ``dest``.

    Raises:
        UsageError, InvalidNameError: a bad URI.
        GateFailedError: the release fails its gates now (nothing downloaded).
        ReleaseYankedError, ReleaseDeletedError, SignatureError, IntegrityError,
            NotCommittedError, StorageError: as registry.pull.pull; nothing is
            placed in ``dest``.
        CommitConflictError: ``dest`` holds something other than this release.

    Notes:
        Each entry lands in ``dest`` by one rename; a process killed while
        renaming leaves a partial ``dest`` that the next run refuses (the pod
        must then start with a fresh ``emptyDir``).
    """
    from registry.pull import pull, resolve_for_pull
    from registry.pull.cache import Cache
    from registry.pull.materialize import check_target
    from registry.release.failing import describe, failing_gates
    from registry.store import open_store
    from registry.store.durable import rename_noreplace
    from registry.trust.release import open_release

    model_id, ref = parse_uri(uri)
    target = Path(dest).expanduser().resolve()
    target.mkdir(parents=True, exist_ok=True)
    for stale in target.glob(STAGING_PREFIX + "*"):
        shutil.rmtree(stale, ignore_errors=True)
    with open_store(store) as s:
        version = resolve_for_pull(s, model_id, ref, trust)
        failed = failing_gates(s, model_id, version)
        if failed and not allow_failing:
            raise GateFailedError(f"{model_id}@{version}: fails its gates now "
                                  f"({describe(failed)}); not placed", failed)
        if any(target.iterdir()):
            # admitted as a pull admits it (yank, deletion, marks, signed snapshot,
            # signature), not after the gates alone: then only compared with DEST
            manifest = open_release(s, model_id, version, trust=trust, verify="now").manifest
            scratch = Cache(cache) if cache else Cache(target / f"{STAGING_PREFIX}check")
            try:
                holds, changed = check_target(target, manifest, scratch,
                                              need_sha256=trust is not None)
            finally:
                if not cache:
                    shutil.rmtree(scratch.root, ignore_errors=True)
            if holds and not changed:
                return {"model_id": model_id, "version": version, "path": str(target),
                        "placed": False}
            raise CommitConflictError(f"{target}: holds other files than {model_id}@{version}"
                                      f"{' (changed: ' + ', '.join(changed[:3]) + ')' if changed else ''}; "
                                      "the model folder must start empty", path=str(target))
        staging = target / f"{STAGING_PREFIX}{uuid.uuid4().hex[:12]}"
        try:
            result = pull(s, model_id, version, to=staging / "model",
                          cache=cache or staging / "cache", trust=trust, ref=ref,
                          blobs=None if cache else False, fsync=False)
            for entry in sorted((staging / "model").iterdir()):
                rename_noreplace(str(entry), str(target / entry.name))
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return {**result.to_dict(), "path": str(target), "placed": True}


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
    path = os.environ.get("REGISTRY_TERMINATION_LOG", TERMINATION_LOG)
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(line[:4000] + "\n")
    except OSError:
        pass  # not in a pod: stderr said it


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``registry-storage-initializer URI DEST`` (exit codes above)."""
    from registry.cli.errors import exit_code_for
    from registry.cli.output import shown
    from registry.rules.numbers import dumps
    from registry.host.redact import redact

    args = sys.argv[1:] if argv is None else argv
    try:
        if len(args) != 2 or args[0].startswith("-"):
            raise UsageError("usage: registry-storage-initializer registry://MODEL@REF DEST")
        doc = initialize(args[0], args[1], trust=_trust_from_env(),
                         allow_failing=os.environ.get("REGISTRY_ALLOW_FAILING") == "1",
                         cache=os.environ.get("REGISTRY_CACHE") or None)
    except RegistryError as e:
        text = str(e).strip().split("\n")[0] or type(e).__name__
        _say(f"error: {redact(shown(text))}")
        sys.exit(exit_code_for(e))
    except OSError as e:
        _say(f"error: {redact(shown(e.strerror or str(e)))}"
             f"{' (' + str(e.filename) + ')' if e.filename else ''}")
        sys.exit(6)
    print(dumps(doc, sort_keys=True, default=str), flush=True)


if __name__ == "__main__":
    main()
