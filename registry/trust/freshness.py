"""The reading host's check of a model's signed snapshot and timestamp (issue 50 item 3).

Where trusted keys are configured, :func:`registry.trust.release.open_release`
calls :func:`admit` before it resolves a ref. When the model has a signed
timestamp (:mod:`registry.trust.snapshot`), or this host accepted one of it
before, or ``$REGISTRY_REQUIRE_SNAPSHOT`` is set, this holds or refuses
(:class:`FreshnessError`, a SignatureError):

1. the timestamp is signed by a trusted, unrevoked key, is this model's, and
   has not expired (**freeze**: a store held at an old state is refused once
   its timestamp runs out);
2. the snapshot it names has exactly the sha256 it names, is signed likewise,
   and is this model's, at that version;
3. neither version is below what this host accepted before (its marks,
   :mod:`registry.trust.marks`): a host never goes back;
4. each record the snapshot lists is checked where it matters: every listed
   revocation and the listed policy.json (the key list) are there with the
   listed bytes; for the release being opened, its listed yank record and
   tombstone are there with the listed bytes (**a yank or deletion listed but
   missing is refused, naming it**); for an alias, its pointer is not at a
   lower move than listed (**rollback**) nor another one at the same move.

A record *not* listed (a yank made after the snapshot, without ``--sign-key``)
only restricts more, and takes effect. Without keys, none of this runs: the
marks alone remain (trust on first use), and :func:`describe_tofu` says so.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from registry.errors import DocumentError, SignatureError
from registry.protocol.layout import alias_key, policy_key, snapshot_key, timestamp_key, \
    tombstone_key, yank_key
from registry.store import Store
from registry.trust import envelope
from registry.trust.snapshot import read_envelope, sha256

if TYPE_CHECKING:
    from registry.trust import Trust
    from registry.trust.marks import Marks

#: set (to anything but "" or "0") on a host that refuses a model without a signed snapshot
REQUIRE_ENV = "REGISTRY_REQUIRE_SNAPSHOT"


class FreshnessError(SignatureError):
    """A signed snapshot or timestamp is missing where required, expired,
    badly signed, or a record differs from what the snapshot lists."""


def _required() -> bool:
    return os.environ.get(REQUIRE_ENV, "").strip() not in ("", "0")


def _now() -> datetime:
    return datetime.now(UTC)


def _parse_time(value: object, where: str) -> datetime:
    try:
        text = str(value)
        return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)
    except ValueError:
        raise FreshnessError(where, f"the timestamp's expires {value!r} is not an RFC 3339 "
                                    "time") from None


@dataclass
class Fresh:
    """A verified snapshot of one model: what its records must be."""

    model_id: str
    version: int
    timestamp: int
    expires: str
    key: str
    records: dict[str, dict[str, Any]] = field(default_factory=dict)

    def describe(self) -> str:
        return (f"signed snapshot {self.version} of {self.model_id} (key {self.key[:16]}, "
                f"timestamp {self.timestamp} valid until {self.expires})")

    def _listed(self, store: Store, key: str, what: str, *, removed: str) -> None:
        listed = self.records.get(key)
        if listed is None:
            return
        raw = _read(store, key, f"{what}, listed in {self.describe()}, is gone: refused, "
                                f"{removed}")
        if sha256(raw) != listed.get("sha256"):
            where = store.url_of(key)
            raise FreshnessError(where, f"{what} differs from the one listed in "
                                        f"{self.describe()} (version {listed.get('version')}, "
                                        f"sha256 {str(listed.get('sha256'))[:16]}): refused, a "
                                        "record changed without a re-signed snapshot "
                                        f"(the writer's fix: registry snapshot sign "
                                        f"{self.model_id} --sign-key KEY)")

    def check_store(self, store: Store) -> None:
        """Every listed revocation and the listed policy.json are as listed."""
        for key in sorted(self.records):
            if key.startswith("ledger/revocations/"):
                self._listed(store, key, f"the revocation {key.rsplit('/', 1)[-1][:-5]!r}",
                             removed="a revocation is never taken as lifted")
        self._listed(store, policy_key(self.model_id),
                     f"the policy (key list) of {self.model_id}",
                     removed="a key list is never taken as dropped")

    def check_release(self, store: Store, version: str) -> None:
        """The release's listed yank record and tombstone are as listed."""
        ref = f"{self.model_id}@{version}"
        self._listed(store, yank_key(self.model_id, version), f"the yank record of {ref}",
                     removed="a removed yank is never taken as lifted")
        self._listed(store, tombstone_key(self.model_id, version), f"the tombstone of {ref}",
                     removed="a deleted release never comes back")

    def check_alias(self, store: Store, alias: str) -> None:
        """The alias's pointer is not below the move the snapshot lists."""
        key = alias_key(self.model_id, alias)
        listed = self.records.get(key)
        if listed is None:
            return
        raw = _read(store, key, f"alias {alias!r} of {self.model_id}, listed at move "
                                f"{listed.get('version')} in {self.describe()}, is gone: "
                                "refused")
        from registry.trust.snapshot import _int_field

        seq = _int_field(raw, "seq")
        want = int(listed.get("version") or 0)
        if seq < want or (seq == want and sha256(raw) != listed.get("sha256")):
            now = f"is at move {seq}" if seq != want else "holds another move of that seq"
            where = store.url_of(key)
            raise FreshnessError(where, f"alias {alias!r} of {self.model_id} {now}, but "
                                        f"{self.describe()} lists move {want}: refused, a "
                                        "rolled-back alias is never followed")


def _read(store: Store, key: str, gone: str) -> bytes:
    """The record at ``key``, which the snapshot lists. Raises FreshnessError
    (``gone``) when it is no longer stored."""
    try:
        return store.read_bytes(key)
    except FileNotFoundError:
        raise FreshnessError(store.url_of(key), gone) from None


def admit(store: Store, model_id: str, trust: Trust, marks: Marks | None) -> Fresh | None:
    """The verified snapshot of ``model_id`` (see the module docstring), or
    None when the model has none and none is required.

    Raises:
        FreshnessError: as the module docstring lists.
        RollbackError: a version below this host's marks.
    """
    tkey = timestamp_key(model_id)
    where = store.url_of(tkey)
    try:
        got = read_envelope(store, tkey)
    except DocumentError as e:
        raise FreshnessError(where, f"the signed timestamp of {model_id} is garbled "
                                    f"({e}): refused") from None
    if got is None:
        seen = marks.seen_snapshot(model_id) if marks is not None else 0
        if seen:
            raise FreshnessError(where, f"{model_id} has no signed timestamp, but this host "
                                        f"accepted its signed snapshot {seen} before: refused, "
                                        "a removed snapshot is never taken as none")
        if _required():
            raise FreshnessError(where, f"{model_id} has no signed snapshot and timestamp, "
                                        f"which this host requires ({REQUIRE_ENV}); sign one: "
                                        f"registry snapshot sign {model_id} --sign-key KEY")
        return None
    key = envelope.verify(got[1], trust, what=f"the timestamp of {model_id}", where=where)
    ts = got[1]["signed"]
    if ts.get("_type") != "timestamp" or ts.get("model_id") != model_id:
        raise FreshnessError(where, f"not a timestamp of {model_id} (it says "
                                    f"{ts.get('_type')!r} of {ts.get('model_id')!r})")
    expires = _parse_time(ts.get("expires"), where)
    if expires <= _now():
        raise FreshnessError(where, f"the signed timestamp of {model_id} expired at "
                                    f"{ts.get('expires')}: refused, the store may be frozen at "
                                    "an old state (re-sign it: registry snapshot refresh "
                                    f"{model_id} --sign-key KEY)")
    named = ts.get("snapshot") if isinstance(ts.get("snapshot"), dict) else {}
    version, digest = named.get("version"), named.get("sha256")
    tversion = ts.get("version")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0
               for v in (version, tversion)):
        raise FreshnessError(where, "the timestamp names no snapshot version")
    skey = snapshot_key(model_id, version)
    swhere = store.url_of(skey)
    try:
        snap = read_envelope(store, skey)
    except DocumentError as e:
        raise FreshnessError(swhere, f"the signed snapshot is garbled ({e}): refused") from None
    if snap is None or sha256(snap[0]) != digest:
        what = "is gone" if snap is None else "is not the one the timestamp names (sha256)"
        raise FreshnessError(swhere, f"snapshot {version} of {model_id} {what}: refused")
    envelope.verify(snap[1], trust, what=f"snapshot {version} of {model_id}", where=swhere)
    signed = snap[1]["signed"]
    if signed.get("_type") != "snapshot" or signed.get("model_id") != model_id \
            or signed.get("version") != version or not isinstance(signed.get("records"), dict):
        raise FreshnessError(swhere, f"not snapshot {version} of {model_id}")
    if marks is not None:
        marks.check_snapshot(model_id, version, tversion, where)
    fresh = Fresh(model_id, version, tversion, str(ts.get("expires")), key,
                  {str(k): v for k, v in signed["records"].items() if isinstance(v, dict)})
    fresh.check_store(store)
    return fresh


def describe_tofu(marks: Marks | None) -> str:
    """What protects a host without trusted keys, said plainly."""
    where = f"marks in {marks.path}" if marks is not None and marks.path else "no marks"
    return ("trust on first use: no trusted keys, so no signed snapshot is checked; this host "
            f"refuses only to go back below what it saw before ({where})")


__all__ = ["REQUIRE_ENV", "Fresh", "FreshnessError", "admit", "describe_tofu"]
