"""``registry push REF oci://...``: a release from the store to an OCI registry.

Order, so that no tag ever names a manifest whose blobs or signature are not
there yet: every layer blob (skipped when present, mounted when asked), the
config and the release manifest; the model manifest by digest; the signature
referrer (and the ``sha256-<hex>`` fallback index where the registry lacks the
referrers API); then the tags (the version, and the alias when asked).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from registry.rules import limits
from registry.obs.tracing import traced
from registry.errors import GateFailedError, ObjectNotFoundError, UsageError
from registry.protocol.layout import release_prefix
from registry.protocol.manifest import Manifest
from registry.trust.model_sig import SIGNATURE, read_signature
from registry.oci import mapping as M
from registry.oci.client import OciClient
from registry.oci.ref import OciRef, check_tag
from registry.trust.release import open_release
from registry.store import Store, join
from registry.formats.modeldir import stored_config


@dataclass(frozen=True, slots=True)
class PushResult:
    """A pushed release: ``ref`` (``oci://host/repo@sha256:...``), ``tags``,
    blob counts by outcome (``uploaded``, ``present``, ``mounted``), bytes
    sent, whether a signature referrer went with it, wall seconds."""

    model_id: str
    version: str
    ref: str
    digest: str
    tags: tuple[str, ...]
    uploaded: int
    present: int
    mounted: int
    bytes_sent: int
    signed: bool
    referrers_api: bool
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v)
                for k in self.__slots__ for v in [getattr(self, k)]}  # type: ignore[attr-defined]


def _architecture(store: Store, prefix: str, files: dict[str, int]) -> str | None:
    doc = stored_config(store, prefix, files, at_most=limits.MAX_JSON_BYTES)
    if doc is None:
        return None
    archs = doc.get("architectures")
    name = archs[0] if isinstance(archs, list) and archs else doc.get("model_type")
    return name if isinstance(name, str) else None


def release_artifact(store: Store, manifest: Manifest) -> M.Artifact:
    """The OCI artifact of a committed release (:func:`registry.oci.mapping.build_artifact`):
    its weights summary and architecture read from the store.

    Raises:
        DocumentError: the stored weights break a rule of :mod:`registry.formats.weights`.
    """
    from registry.release.convert import stored_summary

    model_id, version = str(manifest.meta["model_id"]), str(manifest.meta["version"])
    prefix = release_prefix(model_id, version)
    sizes = {e.path: e.size for e in manifest.files}
    return M.build_artifact(manifest, stored_summary(store, model_id, version, sizes),
                            architecture=_architecture(store, prefix, sizes),
                            signature=SIGNATURE if SIGNATURE in sizes else None)


def signature_referrer(artifact: M.Artifact, manifest: Manifest) -> bytes | None:
    """The referrer manifest carrying the release's ``model.sig`` (None: unsigned)."""
    entry = manifest.entry(SIGNATURE)
    if entry is None:
        return None
    return M.signature_manifest(artifact.descriptor, entry.sha256, entry.size,
                                manifest.created_at)


@traced("registry.oci.push")
def push(store: Store, model_id: str, name: str, target: OciRef, client: OciClient, *,
         alias_tag: str | None = None, workers: int = 4, mount_from: str | None = None,
         chunk_size: int | None = None, allow_failing: bool = False,
         allow_yanked: bool = False, progress: Callable[[int], None] | None = None
         ) -> PushResult:
    """Push release ``model_id@name`` (a version or an alias) to ``target``.

    Args:
        target: the repository; its tag (default: the version) names the push.
        alias_tag: also tag the manifest with this (``name`` when it is an alias
            and the caller asks for it).
        workers: parallel blob uploads.
        mount_from: a repository of the same registry to mount blobs from.
        chunk_size: upload blobs larger than this in PATCH chunks of this
            many bytes (None: one streaming PUT per blob).
        allow_failing, allow_yanked: push a release that fails its gates now,
            or is yanked (refused by default, as ``pull --require-passing``).
        progress: called with each uploaded chunk's byte count.

    Returns:
        A PushResult.

    Raises:
        NotCommittedError, ManifestError, ReleaseDeletedError: as a pull.
        ReleaseYankedError: yanked and not ``allow_yanked``.
        GateFailedError: fails its gates now and not ``allow_failing``.
        IntegrityError: the store's ``model.sig`` differs from its manifest
            entry, or the OCI registry refused a blob's bytes as not hashing to
            its digest (a file in the store differs from MANIFEST.json).
        StorageError (and subclasses): the OCI registry refused or failed.
        UsageError: ``workers`` < 1, a tag outside the OCI tag grammar, or a
            ``client`` for another repository than ``target``.

    Notes:
        Nothing is tagged until every blob, the manifest and its signature
        referrer are in: an interrupted push leaves untagged blobs, which a
        second push finds present and skips.
    """
    t0 = time.perf_counter()
    if workers < 1:
        raise UsageError(f"--workers {workers}: must be at least 1")
    if (target.host, target.repo) != (client.ref.host, client.ref.repo):
        raise UsageError(f"{target}: the client is for {client.ref}")
    # admitted by the trust function (registry.trust.release), as every door
    opened = open_release(store, model_id, name, allow_yanked=allow_yanked,
                          gates=not allow_failing)
    version = opened.version
    if opened.failed and not allow_failing:
        raise GateFailedError(f"{model_id}@{version}: not pushed (--allow-failing "
                              "pushes a release that fails its gates)", opened.failed)
    tags = [check_tag(target.tag or version, what="tag")]
    if alias_tag and alias_tag not in tags:
        tags.append(check_tag(alias_tag, what="alias tag"))
    prefix, manifest = opened.prefix, opened.manifest
    sig = read_signature(store, prefix, manifest)
    artifact = release_artifact(store, manifest)
    on = progress or (lambda n: None)

    def counted(chunks: Iterator[bytes]) -> Iterator[bytes]:
        for block in chunks:
            on(len(block))
            yield block

    def data(b: bytes) -> Callable[[], Iterator[bytes]]:
        return lambda: iter([b])

    def stored(key: str) -> Callable[[], Iterator[bytes]]:
        return lambda: counted(store.iter_read(key))

    jobs: dict[str, tuple[int, Callable[[], Iterator[bytes]]]] = {}
    for path, d in artifact.layers:
        jobs.setdefault(d["digest"][7:], (d["size"], data(artifact.release_manifest)
                                          if path == "MANIFEST.json" else
                                          stored(join(prefix, path))))
    jobs.setdefault(hashlib.sha256(artifact.config).hexdigest(),
                    (len(artifact.config), data(artifact.config)))
    unique = [(h, n, f) for h, (n, f) in jobs.items()]
    outcomes: dict[str, int] = {"uploaded": 0, "present": 0, "mounted": 0}
    sent = 0
    with ThreadPoolExecutor(workers, thread_name_prefix="oci-push") as pool:
        futures = [(pool.submit(client.push_blob, h, n, f, mount_from=mount_from,
                                chunk_size=chunk_size), n) for h, n, f in unique]
        for fut, n in futures:
            outcome = fut.result()
            outcomes[outcome] += 1
            sent += n if outcome == "uploaded" else 0
    client.put_manifest(artifact.digest, artifact.manifest, M.OCI_MANIFEST)
    api = True
    if sig is not None:
        api = _push_signature(client, artifact, sig, manifest.created_at)
    for tag in tags:
        client.put_manifest(tag, artifact.manifest, M.OCI_MANIFEST)
    where = OciRef(target.host, target.repo, None, artifact.digest)
    return PushResult(model_id, version, str(where), artifact.digest, tuple(tags),
                      outcomes["uploaded"], outcomes["present"], outcomes["mounted"], sent,
                      sig is not None, api, time.perf_counter() - t0)


def _push_signature(client: OciClient, artifact: M.Artifact, sig: bytes,
                    created: str) -> bool:
    """Push ``model.sig`` as a referrer of the model manifest; returns whether
    the registry indexed it itself (``OCI-Subject``), else the fallback tag's
    index is updated."""

    sig_hex = hashlib.sha256(sig).hexdigest()
    client.push_blob(sig_hex, len(sig), lambda: iter([sig]))
    client.push_blob(hashlib.sha256(M.EMPTY_JSON).hexdigest(), len(M.EMPTY_JSON),
                     lambda: iter([M.EMPTY_JSON]))
    doc = M.signature_manifest(artifact.descriptor, sig_hex, len(sig), created)
    desc = M.descriptor(M.OCI_MANIFEST, doc, artifactType=M.SIGSTORE_BUNDLE)
    subject = client.put_manifest(desc["digest"], doc, M.OCI_MANIFEST)
    if subject == artifact.digest:
        return True
    tag = M.fallback_tag(artifact.digest)
    try:
        data, _, _ = client.get_manifest(tag, accept=[M.OCI_INDEX])
        existing = M.parse_index(data, where=f"{client.ref.repo}:{tag}")
    except ObjectNotFoundError:
        existing = []
    client.put_manifest(tag, M.merged_index(existing, desc), M.OCI_INDEX)
    return False
