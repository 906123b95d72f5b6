"""``registry pull oci://... --to DIR`` and ``registry import oci://...``.

Pull opens the artifact once (tag -> digest), then runs the store pull over
:class:`registry.oci.store.OciStore`: the same cache, resume, placement,
per-byte sha256 checks and signature check (before anything is placed) as a
pull from a store. Another tool's artifact (no MANIFEST.json layer) pulls as a
directory of its files; its tar layers (olot, modctl) are downloaded, checked
against their digest, and unpacked (regular files only, safe paths) first.

Import pulls into a scratch directory and publishes it with
:meth:`registry.api.Registry.publish`: the same gates, signing and index as
``registry publish``.
"""

from __future__ import annotations

import gzip
import hashlib
import shutil
import tarfile
import tempfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from registry.rules import limits, schemas
from registry.errors import DocumentError, SignatureError, UsageError
from registry.protocol.manifest import FileEntry, Manifest, check_path
from registry.trust.model_sig import SIGNATURE
from registry.oci import mapping as M
from registry.oci.client import OciClient
from registry.oci.ref import OciRef
from registry.oci.store import OciArtifact, OciStore, open_artifact
from registry.pull import PullResult, pull
from registry.pull.cache import Cache

if TYPE_CHECKING:
    from registry.api import Registry
    from registry.release.model_release import ReleaseResult
    from registry.trust import Trust

_COPY = 1 << 20
#: the folder a modelcar (olot, KServe) keeps its files in: dropped from tar paths
MODELCAR = "models/"


def _unpack(client: OciClient, art: OciArtifact, into: Path) -> None:
    """Download each tar layer of ``art`` (checked against its digest as it
    streams), unpack its regular files under ``into`` (hashing them) and
    make ``art.manifest`` list them with the raw layers.

    Raises:
        IntegrityError: a tar layer differs from its digest or size.
        DocumentError: a member is a link, device or FIFO, or unpacks to a path
            another layer or member already has; the archive is damaged.
        UnsafePathError: a member's path is absolute or has ``..``.
    """
    entries = list(art.manifest.files)
    paths = {e.path for e in entries}
    for layer in art.tars:
        tar_path = into / f".layer-{layer.sha256}.tar"
        with open(tar_path, "wb") as f:
            for block in client.blob(layer.sha256, layer.size):
                f.write(block)
        where = f"{art.ref.host}/{art.ref.repo}@sha256:{layer.sha256}"
        gz = layer.media_type in M.GZIP_TAR_TYPES
        budget = limits.MAX_READ_BYTES if gz else layer.size  # a gzip bomb stops here
        try:
            with tarfile.open(tar_path, "r:gz" if gz else "r:") as tf:
                for m in tf:
                    name = m.name.removeprefix("./").removeprefix("/").rstrip("/")
                    name = name.removeprefix(MODELCAR)
                    if m.isdir() or not name:
                        continue
                    if not m.isfile():
                        raise DocumentError(where, f"member {m.name!r} is not a regular "
                                                   "file (links, devices and FIFOs are refused)")
                    check_path(name, source=where)
                    budget -= m.size
                    if budget < 0:
                        raise DocumentError(where, f"unpacks to more than "
                                                   f"{limits.MAX_READ_BYTES} bytes "
                                                   "(REGISTRY_MAX_READ_BYTES)")
                    if name in paths:
                        raise DocumentError(where, f"{name!r}: in two layers or twice in one")
                    paths.add(name)
                    dest = into / "files" / name
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    h = hashlib.sha256()
                    src = tf.extractfile(m)
                    assert src is not None
                    with src, open(dest, "wb") as out:
                        while block := src.read(_COPY):
                            h.update(block)
                            out.write(block)
                    entries.append(FileEntry(name, m.size, h.hexdigest()))
                    art.unpacked[name] = dest
        except (tarfile.TarError, EOFError, gzip.BadGzipFile, zlib.error) as e:
            raise DocumentError(where, f"not a readable tar archive ({e})") from None
        finally:
            tar_path.unlink(missing_ok=True)
    art.manifest = Manifest.build("release", entries, **dict(art.manifest.meta))


def pull_oci(client: OciClient, ref: OciRef, *, to: str | Path | None = None,
             cache: str | Path | None = None, trust: Trust | None = None,
             model_id: str | None = None, version: str | None = None,
             **kw: Any) -> PullResult:
    """Pull the model artifact ``ref`` names to a model directory.

    Args:
        to, cache, trust, and ``kw`` (workers, verify, force, fsync, blobs,
            progress, on_start, range_threshold): as :func:`registry.pull.pull`.
        model_id, version: names for another tool's artifact (the cache path
            and pull record); ours carry their own.

    Returns:
        A PullResult (``model_id``/``version``: the artifact's).

    Raises:
        SignatureError: ``trust`` given and the artifact has no signature
            referrer (or another tool's artifact, which cannot carry
            ``model.sig``), or one that fails the checks of
            :func:`registry.pull.pull`; nothing is placed.
        IntegrityError: a blob, layer or manifest differs from its digest or
            size; nothing is placed under a final name.
        DocumentError, ManifestError, UnsafePathError: as
            :func:`registry.oci.store.open_artifact` and :func:`_unpack`.
        And as :func:`registry.pull.pull` and :class:`OciClient`.

    Notes:
        The tag is read once; everything after is fetched by digest.
    """
    art = open_artifact(client, ref, model_id=model_id, version=version)
    return _pull_artifact(client, art, to=to, cache=cache, trust=trust, **kw)


def _pull_artifact(client: OciClient, art: OciArtifact, *, to: str | Path | None,
                   cache: str | Path | None, trust: Trust | None, **kw: Any) -> PullResult:
    ref = art.ref
    if trust is not None and art.manifest.entry(SIGNATURE) is None:
        raise SignatureError(str(ref), "unsigned: the artifact carries no model.sig (this "
                                       "host accepts only releases signed by a trusted key)")
    scratch = None
    try:
        if art.tars:
            c = Cache(cache)
            scratch = Path(tempfile.mkdtemp(prefix="oci-unpack-", dir=c.root))
            _unpack(client, art, scratch)
        return pull(OciStore(client, art), art.model_id, art.version, to=to, cache=cache,
                    trust=trust, **kw)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


#: release documents an import takes from the artifact, not as model files
_OWN = ("ledger.json", "evals/summary.json")


def import_oci(registry: Registry, client: OciClient, ref: OciRef, model_id: str,
               version: str, *, ledger: Any = None, eval_summary: Any = None,
               trust: Trust | None = None, cache: str | Path | None = None,
               progress: Callable[[int], None] | None = None,
               **publish_kw: Any) -> ReleaseResult:
    """Pull ``ref`` (checked as :func:`pull_oci`) and publish it as
    ``model_id@version`` through ``registry`` (gates, signing, index).

    Args:
        ledger, eval_summary: as :meth:`registry.release.ModelRelease.publish`;
            default: the artifact's own ``ledger.json`` / ``evals/summary.json``
            (one of ours carries them).
        publish_kw: heads, card, dtype, require, sign_key, forbid_code, ...

    Returns:
        The publish's ReleaseResult.

    Raises:
        UsageError: no ledger or eval summary given and the artifact has none.
        As :func:`pull_oci` and :meth:`registry.api.Registry.publish`
        (GateFailedError, VersionExistsError...); nothing is committed when
        either fails.

    Notes:
        The artifact's ``model.sig`` is carried when it names ``model_id@version``
        (publish checks it covers the files); under other names it is dropped
        (sign the import with ``sign_key``). The artifact's MANIFEST.json is not
        carried: the import is a new release, with ``source.uri`` the reference.
    """
    with tempfile.TemporaryDirectory(prefix="registry-oci-import-") as tmp:
        art = open_artifact(client, ref, model_id=model_id, version=version)
        res = _pull_artifact(client, art, to=Path(tmp) / "model", cache=cache, trust=trust,
                             progress=progress)
        d = Path(res.path)
        docs: dict[str, Any] = {}
        for name in _OWN:
            f = d / name
            if f.is_file():
                docs[name] = schemas.load_json(limits.read_local(f, limits.MAX_JSON_BYTES),
                                               path=f"{ref}#{name}")
                f.unlink()
        if ledger is None:
            ledger = docs.get("ledger.json")
        if eval_summary is None:
            eval_summary = docs.get("evals/summary.json")
        if ledger is None or eval_summary is None:
            raise UsageError(f"{ref}: carries no {'ledger.json' if ledger is None else ''}"
                             f"{' or ' if ledger is None and eval_summary is None else ''}"
                             f"{'evals/summary.json' if eval_summary is None else ''}: give "
                             "--ledger and --evals")
        heads = d / "heads"
        if heads.is_dir() and "heads" not in publish_kw:
            publish_kw["heads"] = []
            for h in sorted(heads.glob("*.json")):
                publish_kw["heads"].append(schemas.load_json(
                    limits.read_local(h, limits.MAX_JSON_BYTES), path=f"{ref}#heads/{h.name}"))
            shutil.rmtree(heads)
        shutil.rmtree(d / "evals", ignore_errors=True)
        if (res.model_id, res.version) != (model_id, version):
            (d / SIGNATURE).unlink(missing_ok=True)
        pinned = OciRef(ref.host, ref.repo, None, art.digest)
        return registry.publish(d, model_id, version, ledger=ledger, eval_summary=eval_summary,
                                source_uri=str(pinned), **publish_kw)
