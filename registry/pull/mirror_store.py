"""A read-only Store over a ``registry serve`` mirror's Hub API: ``registry pull --from URL``.

The pull runs unchanged over it: the manifest (``MANIFEST.json``, whose
sha256 is checked against the commit id the server names), ``model.sig`` and
every file are read through ``/{namespace}/{model_id}/resolve/{version}/{path}``,
and the pull checks them exactly as from the store (sizes, sha256 or pieces
of every byte, the signature against this host's trusted keys). A version is
always fetched by its name, never by an alias, so an alias moved mid-pull
cannot mix two releases. Aliases are read from the revision API
(``/api/models/{repo}/revision/{alias}``): the alias pointer this store
shows is the signed move the mirror hands over (``registry.alias_move``),
so :func:`registry.trust.release.open_release` checks it exactly like a
store's pointer; a mirror that names only a version (``registry.version``)
shows a bare pointer, which a host with trusted keys refuses (issue 50: a
mirror's answer is a hint, never the evidence).

The trust records (the signed timestamp and snapshot, yank records,
tombstones, revocations, a model's policy.json: :mod:`registry.trust.relay`)
are read from the mirror's ``/api/registry/records/{key}``, capped like every
document; they are hints too, checked by the trust function against the
signed snapshot (a mirror that drops a listed yank is refused like a store
writer who did). Other keys the mirror cannot serve (checkpoints, the rest
of the ledger) are absent (ObjectNotFoundError); nothing can be written (StorageError). Stdlib HTTP only
(http.client through urllib); ``$HF_TOKEN`` or ``token`` is sent as
``Authorization: Bearer``.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import IO, Any
from urllib.parse import quote, urljoin, urlsplit

from registry.rules import limits, schemas
from registry.errors import DocumentError, IntegrityError, ObjectNotFoundError, StorageError
from registry.store.base import CHUNK, ObjectInfo, ReadOnly, Store

#: seconds to wait for the mirror to connect or answer
TIMEOUT = 30.0
#: ``$REGISTRY_MIRROR``: the default of ``registry pull --from``
MIRROR_ENV = "REGISTRY_MIRROR"


class MirrorDownError(StorageError):
    """The mirror cannot be reached (connection refused, timeout, DNS)."""


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    return parts.scheme, (parts.hostname or "").lower(), port


class _SameOrigin(urllib.request.HTTPRedirectHandler):
    """Follow a redirect only to the same origin (scheme, host, port): the
    bearer token is never sent anywhere else (urllib would carry it along)."""

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any,
                         newurl: str) -> Any:
        target = urljoin(req.full_url, newurl)
        if _origin(target) != _origin(req.full_url):
            raise StorageError(f"{req.full_url}: the mirror redirected to another origin "
                               f"({_origin(target)[1]}); not followed (credentials never "
                               "cross origins)", key=req.full_url)
        return super().redirect_request(req, fp, code, msg, headers, target)


_OPENER = urllib.request.build_opener(_SameOrigin)


class MirrorStore(ReadOnly, Store):
    """The releases a ``registry serve`` at ``base`` (``http://host:port``) serves.

    Raises (from its methods):
        ObjectNotFoundError: the mirror answers 404 (or 403: refused by its
            gates or signature policy, the reason in the message).
        MirrorDownError: the mirror cannot be reached.
        IntegrityError: the mirror answers 409 (its store's bytes differ from
            the manifest; it sends none of them).
        StorageError: any other HTTP error, and every write.
    """

    atomic_rename = False
    conditional_create = False
    compare_and_swap = False

    def __init__(self, base: str, *, namespace: str = "registry",
                 token: str | None = None) -> None:
        base = base.rstrip("/")
        if not base.startswith(("http://", "https://")):
            raise StorageError(f"--from {base!r}: expected http://HOST:PORT or https://...")
        super().__init__(base, None, "")  # type: ignore[arg-type]
        self.namespace = namespace
        self.token = token if token is not None else os.environ.get("HF_TOKEN")

    def url_of(self, key: str) -> str:
        return f"{self.url}#{key}" if key else self.url

    # -- HTTP ---------------------------------------------------------------------

    def _request(self, url: str, *, method: str = "GET",
                 headers: dict[str, str] | None = None) -> Any:
        h = dict(headers or {})
        if self.token:
            h["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(url, headers=h, method=method)
        try:
            return _OPENER.open(req, timeout=TIMEOUT)
        except urllib.error.HTTPError as e:
            why = e.headers.get("X-Error-Message") or e.reason
            e.close()
            if e.code in (403, 404):
                raise ObjectNotFoundError(f"{url}: {e.code} {why}", key=url) from None
            if e.code == 409:  # the mirror's store holds other bytes than the manifest
                raise IntegrityError(url, reason=f"the mirror refused it: {why}") from None
            failed = StorageError(f"{url}: HTTP {e.code} {why}", key=url)
            failed.status = e.code  # type: ignore[attr-defined]  (judged by, never the text)
            raise failed from None
        except (urllib.error.URLError, OSError) as e:
            raise MirrorDownError(f"{self.url}: the mirror cannot be reached ({e})",
                                  key=url) from None

    def _repo(self, model_id: str) -> str:
        """The mirror's repo id of ``model_id`` (or of its key segment
        ``<org>@<name>``): ``<org>/<name>`` as on the Hub for a namespaced id,
        ``<namespace>/<name>`` for a single name."""
        from registry.rules.names import model_from_key

        model_id = model_from_key(model_id.replace("/", "@"))
        if "/" in model_id:
            return "/".join(quote(p, safe="") for p in model_id.split("/"))
        return f"{self.namespace}/{quote(model_id, safe='')}"

    def revision(self, model_id: str, revision: str) -> dict[str, Any]:
        """The mirror's model-info document of ``model_id@revision``."""
        url = (f"{self.url}/api/models/{self._repo(model_id)}/revision/"
               f"{quote(revision, safe='')}")
        cap = limits.MAX_JSON_BYTES
        with self._request(url) as r:
            data = limits.read_at_most(r, cap)
        if len(data) > cap:
            raise DocumentError(url, f"model info larger than {cap} bytes "
                                     "(REGISTRY_MAX_JSON_BYTES)")
        doc: dict[str, Any] = schemas.load_json(data, path=url)
        return doc

    def _record_url(self, key: str) -> str | None:
        """The URL of trust record ``key`` on the mirror (None: not a relayed key)."""
        from registry.trust.relay import ROUTE, relayed

        if relayed(key) is None:
            return None
        return self.url + ROUTE + "/".join(quote(p, safe="") for p in key.split("/"))

    def _file_url(self, key: str) -> str:
        parts = key.split("/")
        if len(parts) < 4 or parts[0] != "models" or parts[2] == "refs":
            raise ObjectNotFoundError(f"{self.url}: a mirror serves release files only, "
                                      f"not {key}", key=key)
        return (f"{self.url}/{self._repo(parts[1])}/resolve/{quote(parts[2], safe='')}/"
                + "/".join(quote(p, safe="") for p in parts[3:]))

    def _answer(self, key: str) -> dict[str, Any] | None:
        """For ``models/<m>/refs/<alias>`` or ``models/<m>/<name>/MANIFEST.json``:
        the ``registry`` object of the mirror's answer for ``<alias>``/``<name>``
        (None: it has none)."""
        parts = key.split("/")
        try:
            doc = self.revision(parts[1], parts[3] if parts[2] == "refs" else parts[2])
        except ObjectNotFoundError:
            return None
        reg = doc.get("registry")
        return reg if isinstance(reg, dict) else None

    def _version_of(self, key: str) -> str | None:
        """The version the mirror resolves the name of ``key`` to (None: none)."""
        version = (self._answer(key) or {}).get("version")
        return str(version) if version else None

    # -- primitives -------------------------------------------------------------------

    def open_read(self, key: str) -> IO[bytes]:
        record = self._record_url(key)
        if record is not None:  # read by the caller up to its cap (read_bytes)
            return self._request(record)  # type: ignore[no-any-return]
        parts = key.split("/")
        if len(parts) == 4 and parts[0] == "models" and parts[2] == "refs":
            import io

            answer = self._answer(key) or {}
            version = str(answer.get("version") or "") or None
            if version is None or version == parts[3]:
                raise ObjectNotFoundError(f"{self.url}: no alias {parts[3]!r} of "
                                          f"{parts[1]!r}", key=key)
            move = answer.get("alias_move")
            if isinstance(move, str) and move:  # the signed move: checked by the reader
                return io.BytesIO(move.encode())
            return io.BytesIO(f"{version}\n".encode())
        if len(parts) == 4 and parts[3] == "MANIFEST.json" and \
                self._version_of(key) != parts[2]:
            raise ObjectNotFoundError(f"{self.url}: no version {parts[2]!r} of {parts[1]!r}",
                                      key=key)
        return self._request(self._file_url(key))  # type: ignore[no-any-return]

    def iter_read(self, key: str, chunk: int = CHUNK) -> Iterator[bytes]:
        with self._request(self._file_url(key)) as r:
            while block := r.read(chunk):
                yield block

    def iter_range(self, key: str, start: int, end: int,
                   chunk: int = CHUNK) -> Iterator[bytes]:
        if end <= start:
            return
        try:
            r = self._request(self._file_url(key), headers={"Range": f"bytes={start}-{end - 1}"})
        except StorageError as e:
            if getattr(e, "status", None) == 416:
                return  # past the end: the object is no longer
            raise
        with r:
            if r.status != 206 and start:
                raise StorageError(f"{self.url}: ignored a Range request for {key}", key=key)
            left = end - start
            while left > 0 and (block := r.read(min(chunk, left))):
                left -= len(block)
                yield block

    def info(self, key: str) -> ObjectInfo:
        parts = key.split("/")
        if self._record_url(key) is not None:
            with self.open_read(key) as f:  # never more than the cap
                return ObjectInfo(key, len(limits.read_at_most(f, limits.MAX_JSON_BYTES)))
        if len(parts) == 4 and parts[0] == "models" and (parts[2] == "refs" or
                                                           parts[3] == "MANIFEST.json"):
            with self.open_read(key) as f:  # never more than the cap, then the reader refuses
                return ObjectInfo(key, len(limits.read_at_most(f, limits.MAX_MANIFEST_BYTES)))
        with self._request(self._file_url(key), method="HEAD") as r:
            return ObjectInfo(key, int(r.headers.get("Content-Length", 0)))

    def list_dir(self, prefix: str) -> list[tuple[str, bool]]:
        raise StorageError(f"{self.url}: a mirror lists nothing (asked for {prefix!r})")

    def walk_files(self, prefix: str) -> dict[str, int]:
        raise StorageError(f"{self.url}: a mirror lists nothing (asked for {prefix!r})")

    def _read_only(self, key: str) -> StorageError:
        return StorageError(f"{self.url}: a mirror is read-only (asked to write {key!r})",
                            key=key)

    def read_versioned(self, key: str) -> tuple[bytes, str]:
        with self.open_read(key) as f:
            data = limits.read_at_most(f, limits.MAX_READ_BYTES)
        if len(data) > limits.MAX_READ_BYTES:
            raise DocumentError(self.url_of(key), f"larger than {limits.MAX_READ_BYTES} bytes "
                                                  "(REGISTRY_MAX_READ_BYTES)")
        return data, ""
