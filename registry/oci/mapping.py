"""A release as an OCI ModelPack artifact, and back: documents only, no network.

The mapping (docs/formats.md, "Releases as OCI artifacts"):

```
image manifest   artifactType application/vnd.cncf.model.manifest.v1+json
 ├ config        application/vnd.cncf.model.config.v1+json (architecture, format,
 │               paramSize, precision, modelfs.diffIds = every layer's digest)
 ├ layers        one raw layer per file of MANIFEST.json, digest = its sha256:
 │                 *.safetensors                      ...weight.v1.raw
 │                 MODEL_CARD.md                      ...doc.v1.raw
 │                 ledger.json, evals/*, heads/*       vnd.modeldir-registry.document.v1+json
 │                 any other file (config, tokenizer)  ...weight.config.v1.raw
 │               and MANIFEST.json itself            vnd.modeldir-registry.manifest.v1+json
 └ referrer      model.sig (a Sigstore bundle): a manifest whose subject is the above,
                 found by the referrers API or the ``sha256-<hex>`` tag's index
```

A layer's path is its ``org.opencontainers.image.title`` (and ``org.cncf.model.filepath``)
annotation. Nothing is re-hashed or re-packed: the documents here are built from
MANIFEST.json alone.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from registry.rules import schemas
from registry.errors import DocumentError
from registry.protocol.manifest import MANIFEST, Manifest, check_path

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_EMPTY = "application/vnd.oci.empty.v1+json"
#: the empty descriptor's content, ``{}``
EMPTY_JSON = b"{}"
MODEL_ARTIFACT = "application/vnd.cncf.model.manifest.v1+json"
MODEL_CONFIG = "application/vnd.cncf.model.config.v1+json"
WEIGHT_RAW = "application/vnd.cncf.model.weight.v1.raw"
WEIGHT_CONFIG_RAW = "application/vnd.cncf.model.weight.config.v1.raw"
DOC_RAW = "application/vnd.cncf.model.doc.v1.raw"
#: the registry's own facts
RELEASE_MANIFEST = "application/vnd.modeldir-registry.manifest.v1+json"
RELEASE_DOCUMENT = "application/vnd.modeldir-registry.document.v1+json"
SIGSTORE_BUNDLE = "application/vnd.dev.sigstore.bundle.v0.3+json"
TITLE = "org.opencontainers.image.title"
FILEPATH = "org.cncf.model.filepath"
CREATED = "org.opencontainers.image.created"
VERSION = "org.opencontainers.image.version"
MODEL_ID = "dev.modeldir-registry.model-id"
RELEASE_DIGEST = "dev.modeldir-registry.manifest-sha256"
#: ModelPack layers this side reads: raw files (the digest is the file's) and
#: tar archives of files (olot, modctl), gzip-compressed too (olot's model card);
#: ``+zstd`` and image layers are refused
RAW_TYPES = frozenset({WEIGHT_RAW, WEIGHT_CONFIG_RAW, DOC_RAW,
                       "application/vnd.cncf.model.dataset.v1.raw",
                       "application/vnd.cncf.model.code.v1.raw", RELEASE_DOCUMENT})
TAR_TYPES = frozenset({"application/vnd.cncf.model.weight.v1.tar",
                       "application/vnd.cncf.model.weight.config.v1.tar",
                       "application/vnd.cncf.model.doc.v1.tar",
                       "application/vnd.cncf.model.dataset.v1.tar",
                       "application/vnd.cncf.model.code.v1.tar"})
GZIP_TAR_TYPES = frozenset(f"{t}+gzip" for t in TAR_TYPES)
TAR_TYPES = TAR_TYPES | GZIP_TAR_TYPES
_DIGEST = re.compile(r"sha256:([0-9a-f]{64})")


def layer_type(path: str) -> str:
    """The media type of a release file's layer (see the module's table)."""
    if path.endswith(".safetensors"):
        return WEIGHT_RAW
    if path == "MODEL_CARD.md":
        return DOC_RAW
    if path == "ledger.json" or path.startswith(("evals/", "heads/")):
        return RELEASE_DOCUMENT
    return WEIGHT_CONFIG_RAW


def canonical(doc: Mapping[str, Any]) -> bytes:
    """JSON bytes of ``doc``: sorted keys, compact, UTF-8 (the same release
    gives the same bytes, hence the same manifest digest, on every push)."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def descriptor(media_type: str, data_or_hex: bytes | str, size: int | None = None,
               **extra: Any) -> dict[str, Any]:
    """An OCI descriptor of ``data`` (bytes), or of a blob given by its sha256
    hex and ``size`` in bytes."""
    if isinstance(data_or_hex, bytes):
        hexd, size = hashlib.sha256(data_or_hex).hexdigest(), len(data_or_hex)
    else:
        hexd = data_or_hex
    return {"mediaType": media_type, "digest": f"sha256:{hexd}", "size": size, **extra}


@dataclass(frozen=True, slots=True)
class Artifact:
    """What a push sends: ``manifest`` (the image manifest's bytes), ``config``
    (its config blob), ``layers``: (release path, descriptor) in manifest order,
    the release's MANIFEST.json last (its bytes are ``release_manifest``)."""

    manifest: bytes
    config: bytes
    layers: tuple[tuple[str, dict[str, Any]], ...]
    release_manifest: bytes

    @property
    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.manifest).hexdigest()

    @property
    def descriptor(self) -> dict[str, Any]:
        return descriptor(OCI_MANIFEST, self.manifest, artifactType=MODEL_ARTIFACT)


def build_artifact(manifest: Manifest, summary: Mapping[str, Any], *,
                   architecture: str | None, signature: str | None) -> Artifact:
    """The image manifest and config of a release.

    Args:
        manifest: the release's MANIFEST.json, parsed.
        summary: :func:`registry.release.convert.stored_summary` of it
            (``parameters``, ``config_dtype``, ``groups``).
        architecture: ``config.json``'s first ``architectures`` entry (or
            ``model_type``), None when it names none.
        signature: the path of the signature file (``model.sig``), which goes
            as a referrer, not a layer; None when the release is unsigned.
    """
    layers = [(e.path, descriptor(layer_type(e.path), e.sha256, e.size,
                                  annotations={TITLE: e.path, FILEPATH: e.path}))
              for e in manifest.files if e.path != signature]
    own = manifest.to_bytes()
    layers.append((MANIFEST, descriptor(RELEASE_MANIFEST, own,
                                        annotations={TITLE: MANIFEST, FILEPATH: MANIFEST})))
    groups = summary.get("groups") or []
    precision = summary.get("config_dtype") or (
        str(groups[0].get("dtype", "")).lower() if groups else None)
    model_id, version = str(manifest.meta["model_id"]), str(manifest.meta["version"])
    config = {"descriptor": {"name": model_id, "version": version,
                             "createdAt": manifest.created_at},
              "config": {k: v for k, v in {
                  "architecture": architecture, "format": "safetensors",
                  "paramSize": str(summary.get("parameters") or 0),
                  "precision": precision}.items() if v},
              "modelfs": {"type": "layers", "diffIds": [d["digest"] for _, d in layers]}}
    config_bytes = canonical(config)
    doc = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": MODEL_ARTIFACT,
           "config": descriptor(MODEL_CONFIG, config_bytes),
           "layers": [d for _, d in layers],
           "annotations": {CREATED: manifest.created_at, VERSION: version, MODEL_ID: model_id,
                           RELEASE_DIGEST: manifest.digest}}
    return Artifact(canonical(doc), config_bytes, tuple(layers), own)


def signature_manifest(subject: Mapping[str, Any], sig_hex: str, sig_size: int,
                       created: str) -> bytes:
    """The referrer that carries ``model.sig`` (its sha256 hex and size) for
    the model manifest ``subject`` (a descriptor)."""
    doc = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": SIGSTORE_BUNDLE,
           "config": descriptor(OCI_EMPTY, EMPTY_JSON),
           "layers": [descriptor(SIGSTORE_BUNDLE, sig_hex, sig_size,
                                 annotations={TITLE: "model.sig"})],
           "subject": {k: subject[k] for k in ("mediaType", "digest", "size")},
           "annotations": {CREATED: created}}
    return canonical(doc)


def fallback_tag(digest: str) -> str:
    """The referrers tag schema's tag of a subject ``sha256:<hex>``."""
    return digest.replace(":", "-", 1)


def merged_index(existing: list[dict[str, Any]], new: Mapping[str, Any]) -> bytes:
    """The referrers fallback index: ``existing`` descriptors plus ``new``
    (once)."""
    manifests = [d for d in existing if d.get("digest") != new["digest"]] + [dict(new)]
    return canonical({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": manifests})


# -- reading another party's documents ------------------------------------------------


@dataclass(frozen=True, slots=True)
class Layer:
    """One layer of a model artifact: ``path`` (its title), media type,
    sha256 hex and size in bytes."""

    path: str
    media_type: str
    sha256: str
    size: int


def digest_hex(value: object, *, where: str) -> str:
    """The hex of a ``sha256:<hex>`` digest.

    Raises:
        DocumentError: another algorithm or shape.
    """
    m = _DIGEST.fullmatch(value) if isinstance(value, str) else None
    if m is None:
        raise DocumentError(where, f"digest {value!r}: expected sha256: and 64 lowercase "
                                   "hex digits")
    return m.group(1)


def _descriptors(doc: Mapping[str, Any], key: str, where: str) -> list[dict[str, Any]]:
    items = doc.get(key)
    if not isinstance(items, list) or not all(isinstance(d, dict) for d in items):
        raise DocumentError(where, f"{key!r} must be a list of descriptors")
    for d in items:
        digest_hex(d.get("digest"), where=where)
        size = d.get("size")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise DocumentError(where, f"descriptor {d.get('digest')}: size {size!r} is not "
                                       "a byte count")
        if not isinstance(d.get("mediaType"), str):
            raise DocumentError(where, f"descriptor {d.get('digest')}: no mediaType")
    return items


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def parse_index(data: bytes, *, where: str) -> list[dict[str, Any]]:
    """The descriptors of an image index (a referrers answer or fallback tag).

    Raises:
        DocumentError: not JSON, not an index, or a bad descriptor.
    """
    doc = schemas.load_json(data, path=where)
    if not isinstance(doc, dict) or doc.get("mediaType", OCI_INDEX) != OCI_INDEX:
        raise DocumentError(where, f"not an OCI image index ({OCI_INDEX})")
    return _descriptors(doc, "manifests", where)


@dataclass(frozen=True, slots=True)
class ModelManifest:
    """A parsed model artifact: its layers, the release-manifest layer when it
    has one (ours), and its annotations."""

    layers: tuple[Layer, ...]
    release_manifest: Layer | None
    annotations: Mapping[str, str]


def parse_model(data: bytes, media_type: str | None, *, where: str) -> ModelManifest:
    """Read an image manifest as a ModelPack artifact.

    Raises:
        DocumentError: not JSON; not an OCI image manifest; neither its
            ``artifactType`` nor its config's media type is ModelPack's;
            a layer of a media type this side does not read (compressed
            tars, image layers); a layer without a path annotation; two
            layers with one path; a bad descriptor.
        UnsafePathError: a raw layer's path is absolute, has ``..`` and so on.
    """
    doc = schemas.load_json(data, path=where)
    if not isinstance(doc, dict) or doc.get("schemaVersion") != 2:
        raise DocumentError(where, "not an OCI manifest (schemaVersion 2)")
    kind = doc.get("mediaType") or media_type
    if kind != OCI_MANIFEST:
        raise DocumentError(where, f"media type {kind!r}: expected {OCI_MANIFEST}")
    config = doc.get("config")
    if not isinstance(config, dict):
        raise DocumentError(where, "no config descriptor")
    if doc.get("artifactType") != MODEL_ARTIFACT and config.get("mediaType") != MODEL_CONFIG:
        raise DocumentError(where, f"not a model artifact: artifactType "
                                   f"{doc.get('artifactType')!r}, config "
                                   f"{config.get('mediaType')!r} (expected {MODEL_ARTIFACT} "
                                   f"or a {MODEL_CONFIG} config)")
    layers: list[Layer] = []
    own: Layer | None = None
    seen: set[str] = set()
    for d in _descriptors(doc, "layers", where):
        notes = _dict(d.get("annotations"))
        path = notes.get(FILEPATH) or notes.get(TITLE)
        kind = d["mediaType"]
        if kind not in RAW_TYPES | TAR_TYPES | {RELEASE_MANIFEST}:
            raise DocumentError(where, f"layer {d['digest']}: media type {kind!r} is not one "
                                       "this registry reads (ModelPack raw or tar layers)")
        if kind in TAR_TYPES:
            path = path or d["digest"]
        elif not isinstance(path, str):
            raise DocumentError(where, f"layer {d['digest']}: no {TITLE} annotation (its "
                                       "file path)")
        layer = Layer(str(path), kind, digest_hex(d["digest"], where=where), d["size"])
        if kind == RELEASE_MANIFEST:
            if own is not None:
                raise DocumentError(where, "two release-manifest layers")
            own = layer
            continue
        if kind not in TAR_TYPES:
            check_path(layer.path, source=where)
        if layer.path in seen:
            raise DocumentError(where, f"two layers for {layer.path!r}")
        seen.add(layer.path)
        layers.append(layer)
    notes = _dict(doc.get("annotations"))
    return ModelManifest(tuple(layers), own,
                         {str(k): str(v) for k, v in notes.items()})
