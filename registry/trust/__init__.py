"""A serving host's trust: public keys and CA certificates, minus revoked ones (issue 17).

Trust lives on the serving host, never in the bucket: public keys given one
by one (``--trusted-key``) and/or a folder (``$REGISTRY_TRUSTED_KEYS``)::

    <folder>/*.pem, *.pub     trusted public keys (current and retired ones)
    <folder>/revoked.json     {"<fingerprint>": {"reason": ..., "revoked_at": ...}}

and CA certificates (``--trusted-ca``, ``$REGISTRY_TRUSTED_CAS``: ``*.pem``,
``*.crt`` and ``revoked.json``) for releases signed with a certificate
(:mod:`registry.trust.certs`). A revoked key or certificate is refused even when
its PEM is still trusted; revoking a key revokes every certificate of it.

Keys are :mod:`registry.trust.keys`, certificates :mod:`registry.trust.certs`; this module
sits above both. Importing it needs no ``[signing]`` extra.

The package (issue 50: one module decides trust) holds, beside the host's
trust here: :mod:`registry.trust.release` (THE trust function,
``open_release``: a ref plus a trust policy -> a release admitted for
reading, or a refusal; every door calls it), :mod:`registry.trust.source`
(trust re-read when its files change, for ``serve``) and
:mod:`registry.trust.marks` (high-water marks: negative facts a store writer
cannot erase unseen). This ``__init__`` imports none of them.


Rooms it may import (tests/test_house.py keeps this list): errors, host, rules, obs, store, protocol, formats, gating, events, lifecycle, pull, refs, release.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from registry.rules import numbers
from registry.trust.certs import Certificate, load_certificates
from registry.errors import DocumentError, UsageError
from registry.host.filemodes import check_trusted_path
from registry.trust.keys import PublicKey, load_public_key
from registry.protocol.manifest import utc_now

REVOKED = "revoked.json"


@dataclass(frozen=True, slots=True)
class Trust:
    """What a serving host trusts: public keys and CA certificates, minus
    revoked fingerprints.

    Attributes:
        keys: trusted public keys (current and retired), unique by fingerprint.
        revoked: key fingerprint -> reason, for keys this host refuses (a
            revoked certificate's key is here too; older files may also list
            certificates by the sha256 of their DER).
        cas: trusted CA certificates, for releases signed with a certificate.
        revoked_ids: ``(issuer, serial hex)`` -> reason, for revoked
            certificates (:mod:`registry.trust.cert_trust`).
    """

    keys: tuple[PublicKey, ...]
    revoked: Mapping[str, str] = field(default_factory=dict)
    cas: tuple[Certificate, ...] = ()
    revoked_ids: Mapping[tuple[str, str], str] = field(default_factory=dict)

    @classmethod
    def of(cls, anchors: Iterable[PublicKey | Certificate]) -> Trust:
        """The trust of a policy's list of keys and CA certificates."""
        items = list(anchors)
        return cls(tuple(a for a in items if isinstance(a, PublicKey)),
                   cas=tuple(a for a in items if not isinstance(a, PublicKey)))

    def describe(self) -> str:
        keys = [f"key {k.name} ({k.fingerprint[:16]})" for k in self.keys]
        cas = [f"CA {c.subject!r} ({c.fingerprint[:16]})" for c in self.cas]
        return ", ".join(keys + cas) or "no key"


def _folder(folder: str | os.PathLike[str] | None, suffixes: tuple[str, ...],
            what: str) -> tuple[list[Path], dict[str, str], dict[tuple[str, str], str]]:
    if folder is None or not str(folder):
        return [], {}, {}
    root = Path(folder)
    if not root.is_dir():
        raise UsageError(f"{root}: {what} is not a directory")
    check_trusted_path(root, what)
    files = sorted(p for p in root.iterdir() if p.suffix in suffixes and p.is_file())
    for p in files:
        check_trusted_path(p, f"file of the {what}")
    return files, read_revoked(root), read_revoked_ids(root)


def load_trust(key_files: Iterable[str | os.PathLike[str]] = (),
               folder: str | os.PathLike[str] | None = None, *,
               ca_files: Iterable[str | os.PathLike[str]] = (),
               ca_folder: str | os.PathLike[str] | None = None) -> Trust:
    """The host's trust from ``--trusted-key`` files, a keys folder,
    ``--trusted-ca`` files and a CA folder (``revoked.json`` of both folders).

    Every file and folder used must be changeable by this user or root
    only (:func:`registry.host.filemodes.check_trusted_path`): another local user
    who could add a key or un-revoke one would decide what this host places.

    Raises:
        UsageError: no key and no CA at all, or a folder is not a directory.
        UnsafeFileModeError: a key, certificate, folder or ``revoked.json``
            another local user can change (a ``UsageError``).
        DocumentError: a key or certificate file, or ``revoked.json``, is malformed.
    """
    keys: dict[str, PublicKey] = {}
    paths, revoked, ids = _folder(folder, (".pem", ".pub"),
                                  "trusted keys folder (REGISTRY_TRUSTED_KEYS)")
    ca_paths, ca_revoked, ca_ids = _folder(ca_folder, (".pem", ".crt"),
                                           "trusted CAs folder (REGISTRY_TRUSTED_CAS)")
    for p in [Path(p) for p in key_files] + paths:
        if p.exists():
            check_trusted_path(p, "trusted key")
        k = load_public_key(p)
        keys.setdefault(k.fingerprint, k)
    cas: dict[str, Certificate] = {}
    ca_paths = [Path(p) for p in ca_files] + ca_paths
    if ca_paths:
        for p in ca_paths:
            if p.exists():
                check_trusted_path(p, "trusted CA certificate")
            for c in load_certificates(p, what="CA certificate"):
                cas.setdefault(c.fingerprint, c)
    if not keys and not cas:
        raise UsageError("no trusted key: give --trusted-key PUB.pem, --trusted-ca CA.pem, or a "
                         "folder of them (REGISTRY_TRUSTED_KEYS, REGISTRY_TRUSTED_CAS)")
    return Trust(tuple(keys.values()), {**ca_revoked, **revoked}, tuple(cas.values()),
                 {**ca_ids, **ids})


def read_revoked(folder: str | os.PathLike[str]) -> dict[str, str]:
    """``revoked.json`` of a keys folder as fingerprint -> reason ({} when absent).

    Raises:
        DocumentError: not a JSON object of ``{fingerprint: {"reason": str}}``.
    """
    path = Path(folder) / REVOKED
    try:
        check_trusted_path(path, "revocation list")
        data = path.read_bytes()
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise DocumentError(str(path), f"cannot read: {e.strerror}") from None
    try:
        doc = json.loads(data)
        return {str(fp): str(v["reason"]) for fp, v in doc.items()}
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
        raise DocumentError(str(path), 'expected {"<fingerprint>": {"reason": "..."}}') from None


def read_revoked_ids(folder: str | os.PathLike[str]) -> dict[tuple[str, str], str]:
    """The revoked certificates of ``revoked.json`` by identity:
    ``(issuer, serial hex)`` -> reason ({} when absent).

    Raises:
        DocumentError: as :func:`read_revoked`; a ``certificate`` entry without
            string ``issuer`` and ``serial``.
    """
    path = Path(folder) / REVOKED
    read_revoked(folder)
    if not path.exists():
        return {}
    out = {}
    for v in json.loads(path.read_bytes()).values():
        cert = v.get("certificate")
        if cert is None:
            continue
        if not isinstance(cert, dict) or not all(isinstance(cert.get(k), str)
                                                 for k in ("issuer", "serial")):
            raise DocumentError(str(path), 'a "certificate" entry needs string "issuer" '
                                           'and "serial"')
        out[(cert["issuer"], cert["serial"].lower())] = str(v["reason"])
    return out


def revoke(folder: str | os.PathLike[str], key: PublicKey | Certificate,
           reason: str) -> dict[str, Any]:
    """List ``key`` (a public key or a certificate) as revoked in
    ``<folder>/revoked.json`` (temp file + rename).

    Raises:
        UsageError: an empty reason or a missing folder.
        DocumentError: an existing revoked.json is malformed.
    """
    if not reason.strip():
        raise UsageError("--reason: must not be empty")
    root = Path(folder)
    if not root.is_dir():
        raise UsageError(f"{root}: not a directory")
    path = root / REVOKED
    try:
        doc = json.loads(path.read_bytes()) if path.exists() else {}
    except ValueError:
        raise DocumentError(str(path), "not JSON") from None
    read_revoked(root)
    entry: dict[str, Any] = {"reason": reason, "revoked_at": utc_now(), "key": key.name}
    fingerprint = key.fingerprint
    if not isinstance(key, PublicKey):
        # by identity and by key, never by the DER's hash (registry.trust.cert_trust)
        fingerprint = key.key_fingerprint
        entry["certificate"] = {"issuer": key.issuer, "serial": key.serial,
                                "subject": key.subject, "sha256": key.fingerprint}
    doc[fingerprint] = entry
    tmp = root / f".{REVOKED}.{os.getpid()}.tmp"
    tmp.write_text(numbers.dumps(doc, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return {"fingerprint": fingerprint, **entry}
