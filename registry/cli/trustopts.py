"""The trust options every command that checks signatures takes, and the trust
they make.

``--trusted-key`` says what its command checks, so each command gives its own
help (:func:`trusted_key_option`); the folders (``--trusted-keys``,
``--trusted-cas``) and their environment variables mean the same everywhere:
each key or certificate in them counts as one given with ``--trusted-key`` /
``--trusted-ca``. :func:`host_trust` turns what was given into the host's
trust (:func:`registry.trust.load_trust`), or None when nothing was.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

TRUSTED_CA_HELP = ("CA certificate (PEM) this host trusts (repeatable): a release signed "
                   "with a certificate must chain to one of them, valid now.")


def trusted_key_option(help: str) -> Any:
    """``--trusted-key PATH`` (repeatable), with what it means for its command."""
    return typer.Option("--trusted-key", metavar="PATH", help=help)


def trusted_ca_option(help: str = TRUSTED_CA_HELP) -> Any:
    """``--trusted-ca PATH`` (repeatable)."""
    return typer.Option("--trusted-ca", metavar="PATH", help=help)


TrustedKeysOpt = Annotated[str | None, typer.Option(
    "--trusted-keys", envvar="REGISTRY_TRUSTED_KEYS", metavar="PATH",
    help="Folder of trusted public keys (*.pem, *.pub) and revoked.json: each key in it "
         "counts as a --trusted-key.")]
TrustedCaOpt = Annotated[list[str] | None, trusted_ca_option()]
TrustedCasOpt = Annotated[str | None, typer.Option(
    "--trusted-cas", envvar="REGISTRY_TRUSTED_CAS", metavar="PATH",
    help="Folder of trusted CA certificates (*.pem, *.crt) and revoked.json: each "
         "certificate in it counts as a --trusted-ca.")]


def host_trust(keys: list[str] | None, folder: str | None, cas: list[str] | None = None,
               ca_folder: str | None = None, *, live: bool = False) -> Any:
    """The trust the options give (:class:`registry.trust.Trust`), None when
    none was given; ``live``: a :class:`registry.trust.source.TrustSource`
    that re-reads its files when they change (a server's)."""
    if not (keys or folder or cas or ca_folder):
        return None
    if live:
        from registry.trust.source import TrustSource

        return TrustSource(keys or [], folder, ca_files=cas or [], ca_folder=ca_folder)
    from registry.trust import load_trust

    return load_trust(keys or [], folder, ca_files=cas or [], ca_folder=ca_folder)
