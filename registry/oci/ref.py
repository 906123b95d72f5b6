"""An OCI reference, parsed once: ``oci://HOST[:PORT]/REPO[:TAG|@sha256:HEX]``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from ipaddress import ip_address

from registry.errors import UsageError

#: the distribution spec's repository name and tag grammars
_PART = r"[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*"
_REPO = re.compile(rf"{_PART}(?:/{_PART})*")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_HOST = re.compile(r"[A-Za-z0-9.-]+(?::[0-9]{1,5})?|\[[0-9A-Fa-f:.]+\](?::[0-9]{1,5})?")
SCHEME = "oci://"


@dataclass(frozen=True, slots=True)
class OciRef:
    """``host`` (``name[:port]``), ``repo`` (``a/b``), and at most one of
    ``tag`` and ``digest`` (``sha256:<hex>``)."""

    host: str
    repo: str
    tag: str | None = None
    digest: str | None = None

    @property
    def reference(self) -> str | None:
        """What goes after ``/manifests/``: the digest, else the tag."""
        return self.digest or self.tag

    @property
    def loopback(self) -> bool:
        """The host is ``localhost`` or a loopback address."""
        name = self.host.rsplit(":", 1)[0] if not self.host.startswith("[") else \
            self.host[1:self.host.index("]")]
        if name == "localhost":
            return True
        try:
            return ip_address(name).is_loopback
        except ValueError:
            return False

    def with_tag(self, tag: str) -> OciRef:
        return OciRef(self.host, self.repo, tag, None)

    def __str__(self) -> str:
        tail = f"@{self.digest}" if self.digest else (f":{self.tag}" if self.tag else "")
        return f"{SCHEME}{self.host}/{self.repo}{tail}"


def is_oci(text: str) -> bool:
    """Whether ``text`` names an OCI reference (starts with ``oci://``)."""
    return text.startswith(SCHEME)


def check_tag(tag: str, *, what: str) -> str:
    """``tag`` when it follows the distribution spec's tag grammar.

    Raises:
        UsageError: it does not (named as ``what``).
    """
    if not _TAG.fullmatch(tag):
        raise UsageError(f"{what} {tag!r}: not a valid OCI tag ([A-Za-z0-9_][A-Za-z0-9._-]"
                         "{0,127})")
    return tag


def parse_ref(text: str) -> OciRef:
    """Parse ``oci://HOST[:PORT]/REPO[:TAG|@sha256:HEX]``.

    Raises:
        UsageError: not that shape: no ``oci://``, no repository, a repository
            or tag outside the distribution spec's grammar, a digest that is
            not ``sha256:`` and 64 lowercase hex digits.
    """
    if not is_oci(text):
        raise UsageError(f"{text!r}: expected oci://HOST[:PORT]/REPO[:TAG|@sha256:HEX]")
    rest = text[len(SCHEME):]
    host, _, path = rest.partition("/")
    if not host or not _HOST.fullmatch(host) or not path:
        raise UsageError(f"{text!r}: expected oci://HOST[:PORT]/REPO[:TAG|@sha256:HEX]")
    tag = digest = None
    if "@" in path:
        path, _, digest = path.partition("@")
        if not _DIGEST.fullmatch(digest):
            raise UsageError(f"{text!r}: the digest must be sha256: and 64 lowercase hex "
                             "digits")
    else:
        last = path.rsplit("/", 1)[-1]
        if ":" in last:
            path, _, tag = path.rpartition(":")
            check_tag(tag, what=f"{text!r}: tag")
    if len(path) > 255 or not _REPO.fullmatch(path):
        raise UsageError(f"{text!r}: repository {path!r} breaks the OCI name rules "
                         "(lowercase a-z0-9 parts joined by . _ __ - and /)")
    return OciRef(host, path, tag, digest)
