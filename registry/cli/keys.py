"""``registry keys``: signing key pairs, fingerprints and revocation on a serving host."""

from __future__ import annotations

from typing import Annotated

import typer

from registry.cli.app import JsonOpt, RegistryTyper, app, print_json
from registry.cli.errors import error_boundary

keys_app = RegistryTyper(help="Signing keys (elliptic curve, PEM) for signed releases.",
                         no_args_is_help=True)
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
        from registry.keys import generate

        priv, pub, fp = generate(private_key, public_path=public_key, curve=curve)
    if as_json:
        print_json({"private_key": str(priv), "public_key": str(pub), "fingerprint": fp})
    else:
        typer.echo(f"private key {priv} (mode 0600), public key {pub}, fingerprint {fp}")


@keys_app.command("fingerprint")
def keys_fingerprint(
    public_key: Annotated[str, typer.Argument(help="Public key (PEM).")],
    as_json: JsonOpt = False,
) -> None:
    """Print a public key's fingerprint (sha256 of its PEM, the bundle's key hint)."""
    with error_boundary(as_json):
        from registry.keys import load_public_key

        key = load_public_key(public_key)
    if as_json:
        print_json({"public_key": public_key, "fingerprint": key.fingerprint})
    else:
        typer.echo(key.fingerprint)


@keys_app.command("revoke")
def keys_revoke(
    public_key: Annotated[str, typer.Argument(help="Public key (PEM) to revoke.")],
    reason: Annotated[str, typer.Option("--reason", metavar="REASON", help="Why (shown when a pull is "
                                                         "refused).")],
    trusted_keys: Annotated[str, typer.Option(
        "--trusted-keys", envvar="REGISTRY_TRUSTED_KEYS", metavar="PATH",
        help="This host's folder of trusted keys, where revoked.json is kept.")],
    as_json: JsonOpt = False,
) -> None:
    """List a key as revoked on this host: pulls of releases it signed are refused."""
    with error_boundary(as_json):
        from registry.keys import load_public_key, revoke

        entry = revoke(trusted_keys, load_public_key(public_key), reason)
    if as_json:
        print_json(entry)
    else:
        typer.echo(f"revoked key {entry['fingerprint']} ({entry['key']}): {entry['reason']}")
