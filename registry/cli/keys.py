"""``registry keys``: signing key pairs, a local CA and its certificates, fingerprints
and revocation on a serving host."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from registry.cli.app import JsonOpt, RegistryTyper, app, print_json
from registry.cli.errors import error_boundary
from registry.cli.output import echo

if TYPE_CHECKING:
    from registry.trust.certs import Certificate

keys_app = RegistryTyper(help="Signing keys (elliptic curve, PEM) and a local CA for signed "
                              "releases.", no_args_is_help=True)
app.add_typer(keys_app, name="keys")


@keys_app.command("generate")
def keys_generate(
    private_key: Annotated[str, typer.Argument(help="Private key file to create (mode 0600).")],
    public_key: Annotated[str | None, typer.Option(
        "--public", metavar="PATH", help="Public key file to create (default: PRIVATE_KEY with .pub).")] = None,
    curve: Annotated[str, typer.Option("--curve", metavar="CURVE", help="secp256r1, secp384r1 or "
                                                       "secp521r1.")] = "secp256r1",
    as_json: JsonOpt = False,
) -> None:
    """Create an EC key pair; never overwrites an existing file."""
    with error_boundary(as_json):
        from registry.trust.keys import generate

        priv, pub, fp = generate(private_key, public_path=public_key, curve=curve)
    if as_json:
        print_json({"private_key": str(priv), "public_key": str(pub), "fingerprint": fp})
    else:
        echo(f"private key {priv} (mode 0600), public key {pub}, fingerprint {fp}")


@keys_app.command("fingerprint")
def keys_fingerprint(
    public_key: Annotated[str, typer.Argument(help="Public key (PEM).")],
    as_json: JsonOpt = False,
) -> None:
    """Print a public key's fingerprint (sha256 of its PEM, the bundle's key hint)."""
    with error_boundary(as_json):
        from registry.trust.keys import load_public_key

        key = load_public_key(public_key)
    if as_json:
        print_json({"public_key": public_key, "fingerprint": key.fingerprint})
    else:
        echo(key.fingerprint)


@keys_app.command("revoke")
def keys_revoke(
    public_key: Annotated[str, typer.Argument(help="Public key or certificate (PEM) to "
                                                   "revoke.")],
    reason: Annotated[str, typer.Option("--reason", metavar="REASON", help="Why (shown when a pull is "
                                                         "refused).")],
    trusted_keys: Annotated[str, typer.Option(
        "--trusted-keys", envvar="REGISTRY_TRUSTED_KEYS", metavar="PATH",
        help="This host's folder of trusted keys, where revoked.json is kept.")],
    as_json: JsonOpt = False,
) -> None:
    """List a key (or certificate) as revoked on this host: pulls of releases it
    signed are refused. Revoking a key revokes every certificate of it; revoking
    a CA certificate, every certificate under it."""
    with error_boundary(as_json):
        from registry.trust.certs import is_certificate_file, load_certificates
        from registry.trust.keys import load_public_key
        from registry.trust import revoke

        key = load_certificates(public_key)[0] if is_certificate_file(public_key) \
            else load_public_key(public_key)
        entry = revoke(trusted_keys, key, reason)
    if as_json:
        print_json(entry)
    else:
        echo(f"revoked {entry['fingerprint']} ({entry['key']}): {entry['reason']}")


SubjectOpt = Annotated[str, typer.Option(
    "--subject", metavar="NAME", help="RFC 4514 name, e.g. 'CN=Release CA,O=Acme'.")]


def _cert_out(key: Path, cert: Path, c: Certificate, as_json: bool, what: str) -> None:
    if as_json:
        print_json({"private_key": str(key), "certificate": str(cert), "subject": c.subject,
                    "issuer": c.issuer, "fingerprint": c.fingerprint})
    else:
        echo(f"{what} {c.subject!r}: private key {key} (mode 0600), certificate {cert}, "
                   f"fingerprint {c.fingerprint}")


@keys_app.command("ca")
def keys_ca(
    private_key: Annotated[str, typer.Argument(help="CA private key file to create (mode 0600).")],
    subject: SubjectOpt,
    cert: Annotated[str | None, typer.Option(
        "--cert", metavar="PATH", help="CA certificate to create (default: PRIVATE_KEY with "
                                       ".crt).")] = None,
    days: Annotated[int, typer.Option("--days", help="Validity in days.")] = 3650,
    as_json: JsonOpt = False,
) -> None:
    """Create a local CA (self-signed, P-256) for certificate-signed releases;
    never overwrites a file. Trust its certificate on serving hosts (--trusted-ca)."""
    with error_boundary(as_json):
        from registry.trust.local_ca import make_ca

        key, crt, c = make_ca(private_key, subject=subject, cert_path=cert, days=days)
    _cert_out(key, crt, c, as_json, "CA")


@keys_app.command("issue")
def keys_issue(
    private_key: Annotated[str, typer.Argument(help="Signing key file to create (mode 0600).")],
    subject: SubjectOpt,
    ca: Annotated[str, typer.Option("--ca", metavar="PATH", help="The CA's private key.")],
    ca_cert: Annotated[str | None, typer.Option(
        "--ca-cert", metavar="PATH", help="The CA's certificate (default: --ca with "
                                          ".crt).")] = None,
    cert: Annotated[str | None, typer.Option(
        "--cert", metavar="PATH", help="Certificate to create (default: PRIVATE_KEY with "
                                       ".crt).")] = None,
    days: Annotated[int, typer.Option("--days", help="Validity in days (at most the "
                                                     "CA's).")] = 365,
    as_json: JsonOpt = False,
) -> None:
    """Create a signing key and its code-signing certificate issued by a local CA
    (for --sign-key/--sign-cert); never overwrites a file."""
    with error_boundary(as_json):
        from registry.trust.local_ca import issue

        key, crt, c = issue(private_key, ca_key=ca, ca_cert=ca_cert, subject=subject,
                            cert_path=cert, days=days)
    _cert_out(key, crt, c, as_json, "certificate")
