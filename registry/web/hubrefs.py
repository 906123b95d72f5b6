"""What a Hub client names, in the registry's terms: repo ids, revisions, the release.

* ``repo_id`` is ``<org>/<name>`` for the namespaced model id
  ``<org>/<name>`` (as on the Hub), ``<namespace>/<model_id>`` for a
  single-name model id (``registry serve --hub-namespace``, default
  ``registry``), or a bare ``<model_id>``. ``<namespace>/<name>`` names the
  single-name model ``<name>`` when the store has one, else the namespaced
  model ``<namespace>/<name>``.
* ``revision`` is a version, an alias (resolved again once the last
  resolution is older than the server's freshness interval, registry.web.fresh,
  so a moved ``prod`` serves the new release within it), or a release's commit id: the
  first 40 hex digits of its manifest digest (``X-Repo-Commit``; stable,
  since a release never changes). ``main`` (the Hub's default) is the alias
  ``main`` when the model has one, else the newest release passing its gates.
* A release is served only when it passes its gates now (unless the
  operator started the server with ``--allow-failing``) and, when the server
  was given trusted keys or CAs, only when its ``model.sig`` verifies against
  them (the checks of ``registry pull --require-passing --trusted-key``).

Every refusal is a :class:`HubError` with the Hub's own ``X-Error-Code``
(``RepoNotFound``, ``RevisionNotFound``, ``EntryNotFound``, ``GatedRepo``),
so a client raises the matching ``huggingface_hub`` error.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from registry.errors import (
    AmbiguousRefError,
    DocumentError,
    GateFailedError,
    InvalidNameError,
    NotCommittedError,
    RegistryError,
    SignatureError,
)
from registry.protocol.manifest import Manifest
from registry.protocol.layout import alias_key, model_root, release_prefix
from registry.rules.names import check_model_id, check_name
from registry.refs.alias_history import read_head
from registry.release.failing import describe, failing_gates
from registry.store import Store, join
from registry.trust.marks import RollbackError
from registry.trust.release import OpenedRelease, Verdicts, is_version, open_release
from registry.trust.source import current
from registry.protocol.verify import read_manifest
from registry.web.failure import failure_of
from registry.web.fresh import Facts

if TYPE_CHECKING:
    from registry.trust import Trust
    from registry.trust.marks import Marks
    from registry.trust.source import TrustSource

COMMIT = re.compile(r"[0-9a-f]{40}")
DEFAULT_NAMESPACE = "registry"
#: seconds a gate verdict (live ledger, policy) and a signature check are
#: reused at least, whatever the server's freshness interval (registry.web.fresh)
GATE_TTL = 5.0


def _outage(exc: BaseException) -> bool:
    """``exc`` is the store failing, not the store's answer (registry.web.failure)."""
    return failure_of(exc) is not None


class HubError(Exception):
    """A refusal in the Hub's terms: HTTP ``status``, ``X-Error-Code`` ``code``
    (or None), a one-line ``message``, and the commit id when one is known."""

    def __init__(self, status: int, code: str | None, message: str, *,
                 commit: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.commit = status, code, message, commit


@dataclass(frozen=True, slots=True)
class Release:
    """A release as the Hub API shows it."""

    repo_id: str
    model_id: str
    version: str
    manifest: Manifest
    #: the bytes of the alias's pointer (its signed move) when it was named by alias
    move: bytes | None = None

    @property
    def prefix(self) -> str:
        return release_prefix(self.model_id, self.version)

    @property
    def commit(self) -> str:
        """The release's commit id: 40 hex digits of its manifest digest."""
        return self.manifest.digest[:40]


@dataclass
class HubPolicy:
    """How ``registry serve`` maps Hub names to releases and what it refuses.

    Attributes:
        namespace: the ``<namespace>`` of ``<namespace>/<model_id>`` repo ids.
        allow_failing: serve releases that fail their gates now.
        trust: keys and CAs a release must be signed by (None: no signature
            needed); a :class:`registry.trust.source.TrustSource` is re-read
            when its files change.
        marks: this server's high-water marks (:mod:`registry.trust.marks`;
            default: in memory for the process).
    """

    store: Store
    namespace: str = DEFAULT_NAMESPACE
    allow_failing: bool = False
    trust: Trust | TrustSource | None = None
    marks: Marks | None = None
    facts: Facts = field(default_factory=Facts)
    _signatures: Verdicts = field(default_factory=Verdicts)
    _manifests: dict[tuple[str, str], Manifest] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if self.marks is None:
            from registry.trust.marks import Marks

            self.marks = Marks(None, self.store.url)

    # -- names ------------------------------------------------------------------------

    def model_of(self, repo_id: str) -> str:
        """The model id ``repo_id`` names.

        Raises:
            HubError: 404 RepoNotFound (only when the store says so).
            StorageError: the store cannot be read (registry.web.failure).
        """
        ns, _, name = repo_id.rpartition("/")
        absent = HubError(404, "RepoNotFound", f"{repo_id}: no such model in "
                          f"{self.store.url} (repo ids are <org>/<name>, "
                          f"{self.namespace}/<model_id> or <model_id>)")
        try:
            check_model_id(repo_id, "repo_id")
        except InvalidNameError:
            raise absent from None
        # the server's namespace names single-name ids first (as before
        # namespaced ids), then the namespaced id of that org
        tries = [name, repo_id] if ns == self.namespace else [repo_id]
        for model_id in tries:
            if self.versions(model_id):
                return model_id
        raise absent

    def versions(self, model_id: str) -> list[str]:
        """The model's version folders (a fact: registry.web.fresh)."""
        return self.facts.get(("versions", model_id), lambda: [
            v for v in self.store.subdirs(model_root(model_id)) if v != "refs"])

    def manifest(self, model_id: str, version: str) -> Manifest:
        """The release's manifest, read from the store once: a committed
        release never changes (whether it still exists is :meth:`versions`).

        Raises:
            NotCommittedError: no release there.
            DocumentError: its manifest is not valid.
            StorageError: the store cannot be read.
        """
        key = (model_id, version)
        with self._lock:
            hit = self._manifests.get(key)
        if hit is None:
            hit = read_manifest(self.store, join(model_root(model_id), version))
            with self._lock:
                self._manifests[key] = hit
        return hit

    def _digest(self, model_id: str, version: str) -> str | None:
        try:
            return self.manifest(model_id, version).digest
        except (NotCommittedError, DocumentError):
            return None

    def _newest_passing(self, model_id: str) -> str | None:
        dated = []
        for v in self.versions(model_id):
            try:
                m = self.manifest(model_id, v)
            except (NotCommittedError, DocumentError):
                continue
            dated.append((m.created_at, v))
        for _, v in sorted(dated, reverse=True):
            if not self.allow_failing and self._gates(model_id, v) is not None:
                continue
            try:  # deleted, yanked, unsigned or rolled back: the trust function decides
                self._open(model_id, v)
            except (RegistryError, OSError) as e:
                if failure_of(e) is not None:
                    raise  # an outage: registry.web.failure answers it
                continue
            return v
        return None

    def _open(self, model_id: str, name: str) -> OpenedRelease:
        """:func:`registry.trust.release.open_release` with this server's trust (as
        its files say now), marks and signature verdicts."""
        return open_release(self.store, model_id, name, trust=current(self.trust),
                            allow_yanked=self.allow_failing, marks=self.marks, verify="now",
                            verdicts=self._signatures, manifests=self.manifest)

    def release(self, repo_id: str, revision: str) -> Release:
        """The release ``revision`` of ``repo_id`` names, right now, as the trust
        function admits it (:func:`registry.trust.release.open_release`), its
        mutable facts at most ``facts.fresh_for`` seconds old (or stale within
        ``facts.stale_for`` while the store cannot be reached).

        Raises:
            HubError: 404 RepoNotFound / RevisionNotFound (also a deleted
                release); 403 GatedRepo when it fails its gates, is yanked,
                its signature or its alias's signed move is not accepted, or
                a record went back below this server's marks; 502 for a
                manifest that is not valid.
            StorageError: the store cannot be read (registry.web.failure).
        """
        model_id = self.model_of(repo_id)
        name = self.facts.get(("version", model_id, revision),
                              lambda: self._version(repo_id, model_id, revision))
        trust = current(self.trust)

        def admitted() -> Release:
            opened = self._open(model_id, name)
            rel = Release(repo_id, model_id, opened.version, opened.manifest)
            if name != opened.version:  # an alias: hand over its signed move, the evidence
                try:
                    head = read_head(self.store, model_id, name)
                    if head.version == opened.version and head.move is not None:
                        rel = Release(repo_id, model_id, opened.version, opened.manifest,
                                      head.move.raw)
                except (RegistryError, OSError) as e:
                    if failure_of(e) is not None:
                        raise
            return rel
        try:  # a fact: read at most once per freshness interval (registry.web.fresh)
            rel = self.facts.get(("release", repo_id, model_id, name, id(trust)), admitted)
        except RollbackError as e:  # a record went back: not a signature's fault
            raise HubError(403, "GatedRepo", f"{repo_id}@{revision}: {e}") from None
        except SignatureError as e:
            raise HubError(403, "GatedRepo", f"{repo_id}@{revision}: signature not accepted: "
                           f"{e}") from None
        except GateFailedError as e:
            raise HubError(403, "GatedRepo", f"{repo_id}@{revision}: {e}") from None
        except (NotCommittedError, InvalidNameError, AmbiguousRefError) as e:
            raise HubError(404, "RevisionNotFound", f"{repo_id}@{revision}: {e}") from None
        except DocumentError as e:
            raise HubError(502, None, f"{repo_id}@{revision}: cannot read its manifest "
                           f"({e})") from None
        except (RegistryError, OSError) as e:
            if failure_of(e) is not None:
                raise  # an outage: registry.web.failure answers it
            raise HubError(502, None, f"{repo_id}@{revision}: cannot read it ({e})") from None
        if COMMIT.fullmatch(revision) and rel.commit != revision:
            raise HubError(404, "RevisionNotFound", f"{repo_id}@{revision}: no release has "
                           "this commit id")
        self._admit(rel)
        return rel

    def _version(self, repo_id: str, model_id: str, revision: str) -> str:
        """The name to open: a commit id's version, ``main``'s fallback, else ``revision``."""
        if COMMIT.fullmatch(revision):
            for v in self.versions(model_id):
                if (self._digest(model_id, v) or "").startswith(revision):
                    return v
            raise HubError(404, "RevisionNotFound", f"{repo_id}@{revision}: no release has "
                           "this commit id")
        try:
            name = check_name(revision, "revision")
            if revision != "main" or is_version(self.store, model_id, "main"):
                return name
            head = read_head(self.store, model_id, "main")
            if head.version is not None or head.move is not None:
                return name  # an alias, or one removed by a move: the trust function decides
            self._refuse_fallback(model_id)
            newest = self._newest_passing(model_id)
            if newest is None:
                raise HubError(404, "RevisionNotFound", f"{repo_id}@main: no alias 'main' "
                               "and no release passing its gates")
            return newest
        except SignatureError as e:
            raise HubError(403, "GatedRepo", f"{repo_id}@{revision}: {e}") from None
        except (NotCommittedError, InvalidNameError, AmbiguousRefError) as e:
            raise HubError(404, "RevisionNotFound", f"{repo_id}@{revision}: {e}") from None
        except (RegistryError, OSError) as e:
            if failure_of(e) is not None:
                raise  # an outage: registry.web.failure answers it
            raise HubError(502, None, f"{repo_id}@{revision}: cannot resolve it ({e})") from None

    def _refuse_fallback(self, model_id: str) -> None:
        """``main`` has no pointer at all. The newest-release fallback is refused
        when this server saw a move of ``main`` before (its pointer was erased,
        :mod:`registry.trust.marks`) or, with trust, when the model's policy
        protects ``main`` (a protected alias is served only through a signed move).

        Raises:
            SignatureError: either of the two.
        """
        where = self.store.url_of(alias_key(model_id, "main"))
        if self.marks is not None:
            self.marks.check_alias(model_id, "main", None, where)
        if current(self.trust) is None:
            return
        from registry.trust.alias_sign import protected_keys
        from registry.protocol.layout import policy_key
        from registry.rules.schemas import load_json

        try:
            doc = load_json(self.store.read_bytes(policy_key(model_id)),
                            path=self.store.url_of(policy_key(model_id)))
        except FileNotFoundError:
            return
        except (RegistryError, OSError) as e:
            raise SignatureError(where, f"the policy cannot be read ({e}); 'main' has no "
                                        "pointer, so nothing is served for it") from None
        if protected_keys(doc, "main", where=where) is not None:
            raise SignatureError(where, "'main' is a protected alias and has no signed "
                                        "pointer: the newest-release fallback is refused")

    # -- what is refused ----------------------------------------------------------------

    def _gates(self, model_id: str, version: str) -> str | None:
        """Why the release fails its gates now, or None."""
        def compute() -> str | None:
            failed = failing_gates(self.store, model_id, version, unavailable=_outage)
            return describe(failed) if failed else None
        return self.facts.get(("gates", model_id, version), compute, at_least=GATE_TTL)

    def passing(self, rel: Release) -> bool:
        """Whether ``rel`` passes its gates now (a fact: registry.web.fresh)."""
        return self._gates(rel.model_id, rel.version) is None

    def _admit(self, rel: Release) -> None:
        if not self.allow_failing:
            why = self._gates(rel.model_id, rel.version)
            if why is not None:
                raise HubError(403, "GatedRepo", f"{rel.model_id}@{rel.version}: fails its "
                               f"gates now ({why}); this server serves only passing releases",
                               commit=rel.commit)
