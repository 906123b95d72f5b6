"""The OCI distribution read API over releases: ``registry serve``'s ``/v2/`` routes.

| route | answer |
|---|---|
| ``GET /v2/`` | ``{}``: the API is here |
| ``GET/HEAD /v2/{repo}/manifests/{ref}`` | ModelPack manifest or signature referrer |
| ``GET/HEAD /v2/{repo}/blobs/{digest}`` | a file (``Range``: 206), config, MANIFEST.json |
| ``GET /v2/{repo}/tags/list`` | the versions and aliases |
| ``GET /v2/{repo}/referrers/{digest}`` | an index of the signature referrer |

``ref`` is a tag (a version or an alias) or a digest; ``repo`` is a Hub repo
id (registry.web.hubrefs: ``<namespace>/<model_id>`` or ``<model_id>``); every
release is admitted
by the same :class:`registry.web.hubrefs.HubPolicy` as the Hub routes: gates,
yanks and (under ``--trusted-keys``) signatures; the token and Host checks are
the app's. The documents are :mod:`registry.oci.mapping`'s, so a manifest
served here has the digest ``registry push`` gives it. File bytes go out only
as their pieces verify (:class:`registry.web.hubfiles.StoreSource`).

Errors carry the spec's JSON (``{"errors": [{"code", "message", "detail"}]}``):
404 ``NAME_UNKNOWN``, ``MANIFEST_UNKNOWN``, ``BLOB_UNKNOWN``; 403 ``DENIED``
for a release refused by its gates, yank or signature; 409 ``DIGEST_INVALID``
for stored bytes that differ from the manifest; 416 for a bad range.
"""

from __future__ import annotations

import functools
import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from registry.errors import IntegrityError, RegistryError
from registry.protocol.layout import refs_prefix
from registry.protocol.manifest import FileEntry
from registry.oci import mapping as M
from registry.oci.push import release_artifact, signature_referrer
from registry.store import join
from registry.web.hub import _counted, parse_range
from registry.web.hubrefs import HubError, HubPolicy, Release

router = APIRouter(include_in_schema=False)
API_VERSION = {"Docker-Distribution-API-Version": "registry/2.0"}
#: releases whose OCI documents are kept (a document costs a weights-header read)
CACHE_SIZE = 256
_NAMES = {"RepoNotFound": "NAME_UNKNOWN", "RevisionNotFound": "MANIFEST_UNKNOWN",
          "GatedRepo": "DENIED", "EntryNotFound": "BLOB_UNKNOWN"}


class OciError(Exception):
    """A refusal in the spec's terms: HTTP ``status``, error ``code``, one line."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def _response(err: OciError, method: str) -> Response:
    if method == "HEAD":
        return Response(status_code=err.status, headers=API_VERSION)
    return JSONResponse({"errors": [{"code": err.code, "message": err.message, "detail": {}}]},
                        status_code=err.status, headers=API_VERSION)


def _guarded(fn: Any) -> Any:
    @functools.wraps(fn)
    def wrapper(request: Request, *args: Any, **kwargs: Any) -> Response:
        try:
            return fn(request, *args, **kwargs)  # type: ignore[no-any-return]
        except OciError as e:
            return _response(e, request.method)
        except HubError as e:
            return _response(OciError(e.status, _NAMES.get(e.code or "", "UNKNOWN"),
                                      e.message), request.method)
        except IntegrityError as e:
            return _response(OciError(409, "DIGEST_INVALID", f"refused: the stored bytes "
                                                             f"differ from the manifest: {e}"),
                             request.method)
        except (RegistryError, OSError) as e:
            return _response(OciError(502, "UNKNOWN", f"the store cannot be read: {e}"),
                             request.method)
    return wrapper


@dataclass
class Served:
    """A release's OCI documents and its blobs by sha256 hex: a file entry
    (streamed verified) or bytes (the documents)."""

    rel: Release
    artifact: M.Artifact
    referrer: bytes | None
    blobs: dict[str, FileEntry | bytes] = field(default_factory=dict)

    @property
    def manifests(self) -> dict[str, bytes]:
        out = {self.artifact.digest: self.artifact.manifest}
        if self.referrer is not None:
            out["sha256:" + hashlib.sha256(self.referrer).hexdigest()] = self.referrer
        return out


class _Documents:
    """Served documents by manifest digest, least recently used dropped first."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: OrderedDict[str, Served] = OrderedDict()

    def get(self, request: Request, rel: Release) -> Served:
        key = rel.manifest.digest
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
                return Served(rel, hit.artifact, hit.referrer, hit.blobs)
        store = _policy(request).store
        artifact = release_artifact(store, rel.manifest)
        served = Served(rel, artifact, signature_referrer(artifact, rel.manifest))
        for e in rel.manifest.files:
            served.blobs.setdefault(e.sha256, e)
        served.blobs[hashlib.sha256(artifact.config).hexdigest()] = artifact.config
        served.blobs[hashlib.sha256(artifact.release_manifest).hexdigest()] = \
            artifact.release_manifest
        served.blobs[hashlib.sha256(M.EMPTY_JSON).hexdigest()] = M.EMPTY_JSON
        with self._lock:
            self._items[key] = served
            while len(self._items) > CACHE_SIZE:
                self._items.popitem(last=False)
        return served


def _policy(request: Request) -> HubPolicy:
    policy: HubPolicy = request.app.state.hub
    return policy


def _documents(request: Request) -> _Documents:
    state = request.app.state
    docs = getattr(state, "oci_documents", None)
    if docs is None:
        docs = state.oci_documents = _Documents()
    return docs  # type: ignore[no-any-return]


def _release(request: Request, repo: str, tag: str) -> Served:
    return _documents(request).get(request, _policy(request).release(repo, tag))


def _admitted(request: Request, repo: str) -> list[Served]:
    """Every release of ``repo`` the policy serves now."""
    policy = _policy(request)
    out = []
    for version in sorted(policy.versions(policy.model_of(repo))):
        try:
            out.append(_release(request, repo, version))
        except HubError:
            continue
    return out


def _digest(value: str) -> str:
    try:
        return M.digest_hex(value, where="digest")
    except RegistryError:
        raise OciError(400, "DIGEST_INVALID", f"{value!r}: expected sha256:<64 hex>") from None


@router.get("/v2/")
@router.get("/v2")
def base() -> Response:
    return JSONResponse({}, headers=API_VERSION)


@router.api_route("/v2/{repo:path}/manifests/{reference}", methods=["GET", "HEAD"])
@_guarded
def manifest(request: Request, repo: str, reference: str) -> Response:
    if reference.startswith("sha256:"):
        _digest(reference)
        data = next((m[reference] for s in _admitted(request, repo)
                     if reference in (m := s.manifests)), None)
        if data is None:
            raise OciError(404, "MANIFEST_UNKNOWN", f"{repo}@{reference}: no release served "
                                                    "here has this manifest")
    else:
        data = _release(request, repo, reference).artifact.manifest
    headers = {**API_VERSION, "Content-Type": M.OCI_MANIFEST,
               "Docker-Content-Digest": "sha256:" + hashlib.sha256(data).hexdigest(),
               "Content-Length": str(len(data))}
    if request.method == "HEAD":
        return Response(status_code=200, headers=headers)
    return Response(data, status_code=200, headers=headers)


@router.api_route("/v2/{repo:path}/blobs/{digest}", methods=["GET", "HEAD"])
@_guarded
def blob(request: Request, repo: str, digest: str) -> Response:
    hexd = _digest(digest)
    found = next(((s, s.blobs[hexd]) for s in _admitted(request, repo) if hexd in s.blobs),
                 None)
    if found is None:
        raise OciError(404, "BLOB_UNKNOWN", f"{repo}@{digest}: no release served here has "
                                            "this blob")
    served, item = found
    size = item.size if isinstance(item, FileEntry) else len(item)
    headers = {**API_VERSION, "Docker-Content-Digest": digest, "Accept-Ranges": "bytes",
               "Content-Type": "application/octet-stream"}
    try:
        span = parse_range(request.headers.get("range"), size)
    except HubError as e:
        err = _response(OciError(416, "BLOB_UNKNOWN", e.message), request.method)
        err.headers["Content-Range"] = f"bytes */{size}"
        return err
    start, end = span if span is not None else (0, size)
    status = 206 if span is not None else 200
    if span is not None:
        headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
    headers["Content-Length"] = str(end - start)
    if request.method == "HEAD":
        return Response(status_code=status, headers=headers)
    stats = request.app.state.hub_stats
    if not isinstance(item, FileEntry):
        stats.sent(end - start)
        return Response(item[start:end], status_code=status, headers=headers)
    rel = served.rel
    blocks = request.app.state.hub_source.open(rel.prefix, item, start, end,
                                               manifest=rel.manifest)
    return StreamingResponse(_counted(blocks, stats), status_code=status, headers=headers)


@router.get("/v2/{repo:path}/tags/list")
@_guarded
def tags(request: Request, repo: str) -> Response:
    policy = _policy(request)
    model_id = policy.model_of(repo)
    names = set(policy.versions(model_id))
    try:
        names |= {n for n, is_dir in policy.store.list_dir(refs_prefix(model_id))
                  if not is_dir}
    except (RegistryError, OSError):
        pass
    listed = sorted(n for n in names if n and not n.startswith("."))
    last = request.query_params.get("last")
    if last:
        listed = [t for t in listed if t > last]
    n = request.query_params.get("n")
    if n and n.isdigit():
        listed = listed[:int(n)]
    return JSONResponse({"name": repo, "tags": listed}, headers=API_VERSION)


@router.get("/v2/{repo:path}/referrers/{digest}")
@_guarded
def referrers(request: Request, repo: str, digest: str) -> Response:
    _digest(digest)
    wanted = request.query_params.get("artifactType")
    found = []
    for s in _admitted(request, repo):
        if s.artifact.digest == digest and s.referrer is not None:
            found.append(M.descriptor(M.OCI_MANIFEST, s.referrer,
                                      artifactType=M.SIGSTORE_BUNDLE))
    headers = dict(API_VERSION)
    if wanted:
        found = [d for d in found if d["artifactType"] == wanted]
        headers["OCI-Filters-Applied"] = "artifactType"
    return JSONResponse({"schemaVersion": 2, "mediaType": M.OCI_INDEX, "manifests": found},
                        headers=headers, media_type=M.OCI_INDEX)
