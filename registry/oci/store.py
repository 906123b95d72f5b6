"""A read-only Store over one model artifact of an OCI registry, pinned to its digest.

``registry pull oci://...`` runs the store pull unchanged over it
(:func:`registry.pull.pull`: cache, resume, placement, sha256 of every byte,
the signature against this host's trusted keys), exactly as
:class:`registry.pull.mirror_store.MirrorStore` does for a mirror:

```
models/<model_id>/<version>/MANIFEST.json   the release-manifest layer (ours), or one
                                            made from the layers (another tool's)
models/<model_id>/<version>/model.sig       the signature referrer's layer
models/<model_id>/<version>/<path>          the layer titled <path>, by digest; a file
                                            of a tar layer: the unpacked copy
```

The tag is resolved to a digest once (:func:`open_artifact`); every later read
is by digest, so a tag moved mid-pull cannot mix two artifacts. Any other key
is absent (ObjectNotFoundError); nothing can be written (StorageError).
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from registry.rules import limits, schemas
from registry.errors import DocumentError, ObjectNotFoundError, SignatureError, StorageError
from registry.protocol.layout import release_prefix
from registry.protocol.manifest import MANIFEST, FileEntry, Manifest, parse_manifest
from registry.trust.model_sig import SIGNATURE
from registry.oci import mapping as M
from registry.oci.client import OciClient
from registry.oci.ref import OciRef
from registry.store.base import CHUNK, ObjectInfo, ReadOnly, Store


@dataclass
class OciArtifact:
    """A model artifact as read: ``digest`` (``sha256:<hex>`` of its manifest),
    the release ``manifest`` it maps to, where each file's bytes are
    (``blobs``: path -> layer sha256 hex; ``unpacked``: path -> local file),
    and whether it is one of ours (carries MANIFEST.json)."""

    ref: OciRef
    digest: str
    manifest: Manifest
    blobs: dict[str, str]
    ours: bool
    tars: tuple[M.Layer, ...] = ()
    unpacked: dict[str, Path] = field(default_factory=dict)

    @property
    def model_id(self) -> str:
        return str(self.manifest.meta["model_id"])

    @property
    def version(self) -> str:
        return str(self.manifest.meta["version"])


def _check_ours(manifest: Manifest, layers: tuple[M.Layer, ...], where: str) -> dict[str, str]:
    """Every file of MANIFEST.json but model.sig is a layer of the same path,
    digest and size, and no layer is another file: the blobs by path."""
    by_path = {layer.path: layer for layer in layers}
    problems = []
    for e in manifest.files:
        if e.path == SIGNATURE:
            continue
        layer = by_path.pop(e.path, None)
        if layer is None:
            problems.append(f"{e.path}: no layer")
        elif (layer.sha256, layer.size) != (e.sha256, e.size):
            problems.append(f"{e.path}: layer sha256:{layer.sha256} ({layer.size} bytes), "
                            f"MANIFEST.json says sha256:{e.sha256} ({e.size} bytes)")
    problems += [f"{p}: a layer MANIFEST.json does not list" for p in sorted(by_path)]
    if problems:
        raise DocumentError(where, "layers and MANIFEST.json disagree: " + "; ".join(problems))
    return {e.path: e.sha256 for e in manifest.files if e.path != SIGNATURE}


def open_artifact(client: OciClient, ref: OciRef, *, model_id: str | None = None,
                  version: str | None = None) -> OciArtifact:
    """Resolve ``ref`` to one manifest digest and read what it maps to.

    Args:
        model_id, version: the names of another tool's artifact (default: the
            repository's last segment, the tag or the digest's first 12 hex
            digits); an artifact of ours always carries its own.

    Raises:
        DocumentError: the manifest is over its cap, not a model artifact,
            names layers of media types this side does not read, or its
            layers and its MANIFEST.json disagree.
        ManifestError, UnsafePathError: the MANIFEST.json layer (or a layer's
            path) breaks the rules.
        IntegrityError: the manifest or the MANIFEST.json layer differs from its
            digest or size.
        ObjectNotFoundError, StorageError: as the client.
    """
    data, media, hexd = client.get_manifest(ref.reference or "latest",
                                            accept=[M.OCI_MANIFEST])
    digest = f"sha256:{hexd}"
    where = str(OciRef(ref.host, ref.repo, None, digest))
    parsed = M.parse_model(data, media, where=where)
    if parsed.release_manifest is not None:
        layer = parsed.release_manifest
        raw = client.read_blob(layer.sha256, layer.size, cap=limits.MAX_MANIFEST_BYTES)
        manifest = parse_manifest(raw, source=f"{where}#{MANIFEST}")
        if manifest.kind != "release":
            raise DocumentError(where, f"its MANIFEST.json is a {manifest.kind}, not a release")
        blobs = _check_ours(manifest, parsed.layers, where)
        return OciArtifact(ref, digest, manifest, blobs, True)
    raw_layers = [la for la in parsed.layers if la.media_type not in M.TAR_TYPES]
    tars = tuple(la for la in parsed.layers if la.media_type in M.TAR_TYPES)
    name = model_id or ref.repo.rsplit("/", 1)[-1]
    ver = version or ref.tag or hexd[:12]
    manifest = Manifest.build("release", [FileEntry(la.path, la.size, la.sha256)
                                          for la in raw_layers],
                              model_id=name, version=ver, source={"uri": str(ref)})
    return OciArtifact(ref, digest, manifest, {la.path: la.sha256 for la in raw_layers}, False,
                    tars)


class OciStore(ReadOnly, Store):
    """The release ``artifact`` maps to, read through ``client``."""

    atomic_rename = False
    conditional_create = False
    compare_and_swap = False

    def __init__(self, client: OciClient, artifact: OciArtifact) -> None:
        super().__init__(str(artifact.ref), None, "")  # type: ignore[arg-type]
        self.client = client
        self.artifact = artifact
        self.prefix = release_prefix(artifact.model_id, artifact.version) + "/"
        self._sizes = {e.path: e.size for e in artifact.manifest.files}
        self._sig: str | None = None

    def url_of(self, key: str) -> str:
        return f"{self.url}#{key}" if key else self.url

    def _path(self, key: str) -> str:
        if not key.startswith(self.prefix) or key[len(self.prefix):] not in self._sizes \
                and key[len(self.prefix):] != MANIFEST:
            raise ObjectNotFoundError(f"{self.url}: holds one release, not {key}", key=key)
        return key[len(self.prefix):]

    def _signature_blob(self) -> str:
        """The sha256 hex of the signature referrer's layer that is the
        release's ``model.sig`` (the one whose digest MANIFEST.json lists)."""
        if self._sig is not None:
            return self._sig
        entry = self.artifact.manifest.entry(SIGNATURE)
        assert entry is not None
        seen = []
        for d in self.client.referrers(self.artifact.digest):
            if d.get("artifactType") not in (M.SIGSTORE_BUNDLE, None):
                continue
            data, media, _ = self.client.get_manifest(d["digest"], accept=[M.OCI_MANIFEST])
            doc = schemas.load_json(data, path=f"{self.url}@{d['digest']}")
            layers = doc.get("layers") if isinstance(doc, dict) else None
            subject = doc.get("subject") if isinstance(doc, dict) else None
            if not isinstance(subject, dict) or subject.get("digest") != self.artifact.digest:
                continue
            for layer in layers if isinstance(layers, list) else []:
                if isinstance(layer, dict) and layer.get("mediaType") == M.SIGSTORE_BUNDLE:
                    seen.append(str(layer.get("digest")))
                    if layer.get("digest") == f"sha256:{entry.sha256}" and \
                            layer.get("size") == entry.size:
                        self._sig = entry.sha256
                        return entry.sha256
        what = (f"the referrers carry other bundles ({', '.join(seen)})" if seen else
                "no signature referrer (referrers API or sha256-<hex> tag)")
        raise SignatureError(self.url, f"MANIFEST.json lists model.sig sha256:{entry.sha256}, "
                                       f"but {what}")

    def _blob(self, path: str) -> str:
        return self._signature_blob() if path == SIGNATURE else self.artifact.blobs[path]

    # -- primitives -------------------------------------------------------------------

    def open_read(self, key: str) -> IO[bytes]:
        path = self._path(key)
        if path == MANIFEST:
            return io.BytesIO(self.artifact.manifest.to_bytes())
        if path in self.artifact.unpacked:
            return open(self.artifact.unpacked[path], "rb")  # noqa: SIM115
        return io.BytesIO(b"".join(self.iter_read(key)))

    def iter_read(self, key: str, chunk: int = CHUNK) -> Iterator[bytes]:
        path = self._path(key)
        if path == MANIFEST or path in self.artifact.unpacked:
            with self.open_read(key) as f:
                while block := f.read(chunk):
                    yield block
            return
        yield from self.client.blob(self._blob(path), self._sizes[path])

    def iter_range(self, key: str, start: int, end: int,
                   chunk: int = CHUNK) -> Iterator[bytes]:
        path = self._path(key)
        end = min(end, self.info(key).size)
        if end <= start:
            return
        if path == MANIFEST or path in self.artifact.unpacked:
            yield from super().iter_range(key, start, end, chunk)
            return
        yield from self.client.blob(self._blob(path), self._sizes[path], start=start, end=end)

    def info(self, key: str) -> ObjectInfo:
        path = self._path(key)
        if path == MANIFEST:
            return ObjectInfo(key, len(self.artifact.manifest.to_bytes()))
        return ObjectInfo(key, self._sizes[path])

    def local_path(self, key: str) -> str | None:
        return None

    def list_dir(self, prefix: str) -> list[tuple[str, bool]]:
        raise StorageError(f"{self.url}: an OCI artifact lists nothing (asked for {prefix!r})")

    def walk_files(self, prefix: str) -> dict[str, int]:
        if prefix.rstrip("/") + "/" != self.prefix:
            raise StorageError(f"{self.url}: holds one release, not {prefix!r}")
        return dict(self._sizes)

    def _read_only(self, key: str) -> StorageError:
        return StorageError(f"{self.url}: an OCI artifact is read-only (asked to write "
                            f"{key!r})", key=key)

    def read_versioned(self, key: str) -> tuple[bytes, str]:
        with self.open_read(key) as f:
            return f.read(), ""
