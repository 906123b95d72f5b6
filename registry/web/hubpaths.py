"""Refusals of Hub requests that never reach a Hub route, in the Hub's terms (issue 47).

``huggingface_hub`` turns an error answer into a typed error only through
``X-Error-Code`` (``RevisionNotFound``, ``EntryNotFound``, ``RepoNotFound``);
any other answer to a download becomes "check your connection". A revision
with ``/`` (``refs/pr/1``, ``feature/x``; the client sends it as ``%2F``)
is refused by the server's path guard (registry.web.app) before routing, and
one sent unencoded matches no route. Both are answered here as the Hub
would: 404 ``RevisionNotFound`` naming the revision (no version, alias or
commit id here contains ``/``); a bad file path in a ``resolve`` or ``tree``
request (``..``, an encoded ``\\``, NUL) is 404 ``EntryNotFound``; a path
under ``/api/models/`` that matches no route is 404 ``RepoNotFound``.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

from registry.web.hubrefs import HubError

#: the Hub API's paths, on the undecoded path: (repo, kind, revision, file)
_API = re.compile(r"/api/models/(?P<repo>[^/]+(?:/[^/]+)?)/(?P<kind>revision|tree)/"
                  r"(?P<rev>[^/]+)(?:/(?P<file>.*))?")
_RESOLVE = re.compile(r"/(?P<repo>[^/]+(?:/[^/]+)?)/resolve/(?P<rev>[^/]+)/(?P<file>.+)")


def _bad_segment(text: str) -> bool:
    decoded = unquote(text)
    return ("/" in decoded or "\\" in decoded or "\x00" in decoded
            or decoded in (".", ".."))


def hub_refusal(raw_path: str, why: str | None = None) -> HubError | None:
    """The Hub-shaped refusal of a request for ``raw_path`` (undecoded) that the
    path guard refused (``why``) or no route matched (``why`` None); None when
    the path is not a Hub path (the caller answers as for any other path).

    Returns:
        HubError 404 with ``RevisionNotFound``, ``EntryNotFound`` or
        ``RepoNotFound`` and a one-line message naming what was asked for.
    """
    for pattern in (_API, _RESOLVE):
        m = pattern.fullmatch(raw_path)
        if m is None:
            continue
        repo, rev = unquote(m.group("repo")), m.group("rev")
        if pattern is _API and m.group("kind") == "revision" and m.group("file") is not None:
            rev = f"{rev}/{m.group('file')}"  # sent unencoded: the rest is the revision's
        if _bad_segment(rev):
            return HubError(404, "RevisionNotFound",
                            f"{repo}@{unquote(rev)}: no such revision (revisions here are "
                            "versions, aliases and commit ids; none contains '/')")
        shown = unquote(m.group("file") or "")
        return HubError(404, "EntryNotFound",
                        f"{repo}@{unquote(rev)}: no file {shown!r}"
                        + (f" ({why})" if why else ""))
    if raw_path.startswith("/api/models/"):
        if why is not None:
            return HubError(404, "RevisionNotFound", f"{unquote(raw_path)}: {why}")
        return HubError(404, "RepoNotFound", f"{unquote(raw_path)}: no such model or revision")
    return None


__all__ = ["hub_refusal"]
