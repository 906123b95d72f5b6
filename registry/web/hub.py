"""The Hugging Face Hub's read API over releases, for every serving stack that speaks it.

| route | what the client uses it for |
|---|---|
| ``GET /api/models/{repo_id}`` | ``model_info`` (revision ``main``) |
| ``GET /api/models/{repo_id}/revision/{revision}`` | ``snapshot_download``: ``sha``, ``siblings`` |
| ``GET /api/models/{repo_id}/tree/{revision}[/{path}]`` | ``list_repo_tree`` (``lfs.oid``) |
| ``HEAD/GET /{repo_id}/resolve/{revision}/{path}`` | ``hf_hub_download``: metadata, bytes |

``repo_id`` and ``revision``: registry.web.hubrefs. Every file is shown as an
LFS file whose ``oid``/``ETag`` is its sha256 and whose size is the manifest's;
``MANIFEST.json`` is served too (its canonical bytes, whose sha256 is the
manifest digest the commit id is cut from). ``Range`` requests get 206 with
``Content-Range``; a bad range 416. Bytes come from a :class:`Source`
(registry.web.hubfiles): verified before they are sent.

Errors carry the Hub's headers (``X-Error-Code``, ``X-Error-Message``):
404 ``RepoNotFound`` / ``RevisionNotFound`` / ``EntryNotFound`` (the last
with ``X-Repo-Commit``, so the client caches the absence), 403
``GatedRepo`` for a release refused by its gates or signature, 409 for
stored bytes that differ from the manifest (not a status the client retries:
retrying cannot make wrong bytes right); a store that fails is answered by
registry.web.failure (503 with ``Retry-After`` for an outage, never a 404).
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Iterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from registry.errors import IntegrityError, RegistryError
from registry.protocol.manifest import MANIFEST, FileEntry
from registry.obs.metrics import store_bytes
from registry.web.failure import failure_of
from registry.web.fresh import reset_stale, stale_age
from registry.web.hubfiles import Source
from registry.web.hubrefs import HubError, HubPolicy, Release
from registry.web.sending import FileSpans, on_file_thread, whole

router = APIRouter(include_in_schema=False)


class HubStats:
    """Bytes this server read from its store and sent to clients (thread-safe);
    ``GET /api/v1/hub/stats`` shows them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.store_bytes = 0
        self.sent_bytes = 0

    def from_store(self, n: int) -> None:
        with self._lock:
            self.store_bytes += n
        store_bytes(n)

    def sent(self, n: int) -> None:
        with self._lock:
            self.sent_bytes += n

    def to_dict(self) -> dict[str, int]:
        with self._lock:
            return {"store_bytes": self.store_bytes, "sent_bytes": self.sent_bytes}

#: git-lfs pointer size the Hub reports for every LFS file
POINTER_SIZE = 134
_RANGE = re.compile(r"bytes=(\d*)-(\d*)")


def header_value(text: str) -> str:
    """``text`` as a header value: one line of printable ASCII (anything else
    escaped as ``\\uXXXX``), at most 1000 characters: a yank reason or a store's
    name in any script never turns an answer into a 500."""
    one = "".join(c if c.isprintable() else " " for c in text)
    return one.encode("ascii", "backslashreplace").decode("ascii")[:1000]


def error_response(err: HubError, method: str = "GET",
                   extra: dict[str, str] | None = None) -> Response:
    headers = {"X-Error-Message": header_value(err.message), **(extra or {})}
    if err.code:
        headers["X-Error-Code"] = err.code
    if err.commit:
        headers["X-Repo-Commit"] = err.commit
    if method == "HEAD":
        return Response(status_code=err.status, headers=headers)
    return JSONResponse({"error": err.message}, status_code=err.status, headers=headers)


def _policy(request: Request) -> HubPolicy:
    policy: HubPolicy = request.app.state.hub
    return policy


def _source(request: Request) -> Source:
    source: Source = request.app.state.hub_source
    return source


def _file(rel: Release, path: str) -> FileEntry:
    """The entry of ``path`` (MANIFEST.json: its canonical bytes)."""
    if path == MANIFEST:
        data = rel.manifest.to_bytes()
        return FileEntry(MANIFEST, len(data), rel.manifest.digest)
    entry = rel.manifest.entry(path)
    if entry is None:
        raise HubError(404, "EntryNotFound", f"{rel.repo_id}@{rel.version}: no file {path!r} "
                       "in the release", commit=rel.commit)
    return entry


def _entries(rel: Release) -> list[FileEntry]:
    return [*rel.manifest.files, _file(rel, MANIFEST)]


def _sibling(e: FileEntry) -> dict[str, Any]:
    return {"rfilename": e.path, "size": e.size, "blobId": e.sha256[:40],
            "lfs": {"sha256": e.sha256, "size": e.size, "pointerSize": POINTER_SIZE}}


def info_document(rel: Release, passing: bool) -> dict[str, Any]:
    """The Hub's model-info JSON of one release (plus a ``registry`` object:
    model id, version, manifest sha256, whether it passes its gates)."""
    return {"_id": rel.commit, "id": rel.repo_id, "modelId": rel.repo_id, "author":
            rel.repo_id.rpartition("/")[0] or None, "sha": rel.commit,
            "lastModified": rel.manifest.created_at, "createdAt": rel.manifest.created_at,
            "private": False, "disabled": False, "gated": False, "tags": [],
            "siblings": [_sibling(e) for e in _entries(rel)],
            "registry": {"model_id": rel.model_id, "version": rel.version,
                         "manifest_sha256": rel.manifest.digest, "passing": passing,
                         # the evidence of an alias (its signed move), for a client's
                         # trust function to check (registry.trust.release)
                         **({"alias_move": rel.move.decode()} if rel.move else {})}}


def error_of(e: BaseException, method: str) -> Response:
    """The Hub's answer to an exception of a Hub route (HubError, a bad
    stored file, or the store failing: registry.web.failure); re-raises
    anything else."""
    if isinstance(e, HubError):
        return error_response(e, method)
    if isinstance(e, IntegrityError):
        return error_response(HubError(409, None, f"refused: the stored bytes differ "
                                       f"from the manifest: {e}"), method)
    if isinstance(e, (RegistryError, OSError)):
        failed = failure_of(e)
        if failed is not None:  # registry.web.failure: never a 404 for an outage
            return error_response(HubError(failed.status, failed.code, failed.message),
                                  method, failed.headers())
        return error_response(HubError(502, None, f"the store cannot be read: {e}"), method)
    raise e


def _guarded(fn: Any) -> Any:
    """Turn HubError (and a store's RegistryError) into the Hub's error response."""
    import functools

    @functools.wraps(fn)
    def wrapper(request: Request, *args: Any, **kwargs: Any) -> Response:
        reset_stale()
        try:
            return _marked(fn(request, *args, **kwargs))
        except (HubError, RegistryError, OSError) as e:
            return error_of(e, request.method)
    return wrapper


def _marked(response: Any, age: float | None = None) -> Any:
    """``response``, saying so when it was decided on facts read before the
    store became unreachable (registry.web.fresh): ``X-Registry-Stale`` is
    their age in whole seconds."""
    age = stale_age() if age is None else age
    if age is not None and isinstance(response, Response):
        response.headers["X-Registry-Stale"] = str(int(age))
        response.headers["Warning"] = '110 - "Response is Stale"'
    return response


def _info(request: Request, repo_id: str, revision: str) -> Response:
    policy = _policy(request)
    rel = policy.release(repo_id, revision)
    return JSONResponse(info_document(rel, passing=policy.passing(rel)))


@router.get("/api/models/{namespace}/{name}/revision/{revision}")
@_guarded
def revision_ns(request: Request, namespace: str, name: str, revision: str) -> Response:
    return _info(request, f"{namespace}/{name}", revision)


@router.get("/api/models/{name}/revision/{revision}")
@_guarded
def revision_bare(request: Request, name: str, revision: str) -> Response:
    return _info(request, name, revision)


@router.get("/api/models/{namespace}/{name}")
@_guarded
def info_ns(request: Request, namespace: str, name: str) -> Response:
    return _info(request, f"{namespace}/{name}", "main")


@router.get("/api/models/{name}")
@_guarded
def info_bare(request: Request, name: str) -> Response:
    return _info(request, name, "main")


def _tree(request: Request, repo_id: str, revision: str, path: str) -> Response:
    rel = _policy(request).release(repo_id, revision)
    recursive = request.query_params.get("recursive", "").lower() in ("1", "true")
    base = path.strip("/")
    files = [e for e in _entries(rel) if not base or e.path.startswith(base + "/")]
    if base and not files:
        raise HubError(404, "EntryNotFound", f"{repo_id}@{revision}: no folder {base!r}",
                       commit=rel.commit)
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for e in files:
        parts = (e.path[len(base) + 1:] if base else e.path).split("/")
        for i in range(len(parts) - 1 if recursive else min(1, len(parts) - 1)):
            d = "/".join(([base] if base else []) + parts[:i + 1])
            if d not in seen:
                seen.add(d)
                out.append({"type": "directory", "oid": rel.commit, "path": d})
        if recursive or len(parts) == 1:
            out.append({"type": "file", "oid": e.sha256[:40], "size": e.size, "path": e.path,
                        "lfs": {"oid": e.sha256, "size": e.size,
                                "pointerSize": POINTER_SIZE}})
    return JSONResponse(out)


@router.get("/api/models/{namespace}/{name}/tree/{revision}")
@_guarded
def tree_ns(request: Request, namespace: str, name: str, revision: str) -> Response:
    return _tree(request, f"{namespace}/{name}", revision, "")


@router.get("/api/models/{namespace}/{name}/tree/{revision}/{path:path}")
@_guarded
def tree_ns_path(request: Request, namespace: str, name: str, revision: str,
                 path: str) -> Response:
    return _tree(request, f"{namespace}/{name}", revision, path)


@router.get("/api/models/{name}/tree/{revision}")
@_guarded
def tree_bare(request: Request, name: str, revision: str) -> Response:
    return _tree(request, name, revision, "")


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """``[start, end)`` of a single-range ``Range`` header (None: the whole
    file). Raises HubError 416 for a range that is malformed or outside the file."""
    if not header:
        return None
    m = _RANGE.fullmatch(header.strip())
    if m is None or (not m.group(1) and not m.group(2)):
        raise HubError(416, None, f"Range {header!r}: only one 'bytes=START-END' range")
    if m.group(1):
        start = int(m.group(1))
        end = min(size, int(m.group(2)) + 1) if m.group(2) else size
    else:
        start, end = max(0, size - int(m.group(2))), size
    if start >= size or end <= start:
        raise HubError(416, None, f"Range {header!r}: outside the file's {size} bytes")
    return start, end


def _prepare(request: Request, repo_id: str, revision: str,
             path: str) -> Response | tuple[Any, ...]:
    """The whole answer (HEAD, MANIFEST.json, a bad range), or what sending
    the file needs: ``(rel, entry, start, end, status, headers, stale age)``."""
    rel = _policy(request).release(repo_id, revision)
    entry = _file(rel, path)
    headers = {"ETag": f'"{entry.sha256}"', "X-Linked-Etag": f'"{entry.sha256}"',
               "X-Linked-Size": str(entry.size), "X-Repo-Commit": rel.commit,
               "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
    try:
        span = parse_range(request.headers.get("range"), entry.size)
    except HubError as e:
        e.commit = rel.commit
        resp = error_response(e, request.method)
        resp.headers["Content-Range"] = f"bytes */{entry.size}"
        return resp
    start, end = span if span is not None else (0, entry.size)
    status = 200
    if span is not None:
        status = 206
        headers["Content-Range"] = f"bytes {start}-{end - 1}/{entry.size}"
    headers["Content-Length"] = str(end - start)
    if request.method == "HEAD":
        return Response(status_code=status, headers=headers)
    stats = request.app.state.hub_stats
    if path == MANIFEST:
        body = rel.manifest.to_bytes()[start:end]
        stats.sent(len(body))
        return Response(body, status_code=status, headers=headers)
    return rel, entry, start, end, status, headers, stale_age()


def _send(request: Request, rel: Release, entry: FileEntry, start: int, end: int,
          status: int, headers: dict[str, str]) -> Response:
    blocks = _source(request).open(rel.prefix, entry, start, end, manifest=rel.manifest)
    return StreamingResponse(_counted(blocks, request.app.state.hub_stats), status_code=status,
                             headers=headers)


async def _resolve(request: Request, repo_id: str, revision: str, path: str) -> Response:
    """A file's metadata or bytes. A source that fills a cache
    (registry.web.mirror) is waited for without holding a request thread:
    clients waiting on a cold file cost the other routes nothing; a file
    being filled is sent piece by piece as its pieces verify
    (registry.web.filling), and a cached file from its verified blob; both
    zero-copy under ``registry serve`` (registry.web.sending). The route's
    blocking work runs on the file routes' own threads
    (registry.web.sending.file_threads), never on those of the JSON API."""
    prepared = await on_file_thread(_guarded(_prepare), request, repo_id, revision, path)
    if isinstance(prepared, Response):
        return prepared
    rel, entry, start, end, status, headers, age = prepared
    source = _source(request)
    fill = getattr(source, "fill", None)
    if fill is not None:
        stats = request.app.state.hub_stats
        try:
            filled = fill(rel.prefix, entry, rel.manifest)
            live = None if filled.done() else source.live(entry.sha256)  # type: ignore[attr-defined]
            if live is not None:  # registry.web.filling: each piece once it verified
                fd = await live.first(start, end)
                if fd is not None:
                    return _marked(FileSpans(fd, live.spans(start, end), status_code=status,
                                             headers=headers, sent=stats.sent), age)
            await asyncio.wrap_future(filled)
            fd = await on_file_thread(source.verified,  # type: ignore[attr-defined]
                                      rel.prefix, entry, rel.manifest)
        except (HubError, RegistryError, OSError) as e:
            return _marked(error_of(e, request.method), age)
        return _marked(FileSpans(fd, whole(start, end), status_code=status, headers=headers,
                                 sent=stats.sent), age)
    sent = await on_file_thread(_guarded(_send), request, rel, entry, start, end, status,
                                headers)
    return _marked(sent, age)  # type: ignore[no-any-return]


def _counted(blocks: Iterator[bytes], stats: Any) -> Iterator[bytes]:
    for block in blocks:
        stats.sent(len(block))
        yield block


@router.api_route("/{namespace}/{name}/resolve/{revision}/{path:path}", methods=["GET", "HEAD"])
async def resolve_ns(request: Request, namespace: str, name: str, revision: str,
                     path: str) -> Response:
    return await _resolve(request, f"{namespace}/{name}", revision, path)


@router.api_route("/{name}/resolve/{revision}/{path:path}", methods=["GET", "HEAD"])
async def resolve_bare(request: Request, name: str, revision: str, path: str) -> Response:
    return await _resolve(request, name, revision, path)
