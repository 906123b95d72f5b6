"""``registry verify``: is a directory committed, and do its files verify."""

from __future__ import annotations

from typing import Annotated

import typer

from registry.cli.app import JsonOpt, app, nothing_stored, print_json
from registry.cli.trustopts import (
    TrustedCaOpt,
    TrustedCasOpt,
    TrustedKeysOpt,
    host_trust,
    trusted_key_option,
)
from registry.cli.errors import EXIT_FAILED, error_boundary, fail
from registry.cli.output import echo, shown
from registry.errors import ObjectNotFoundError
from registry.store import open_store
from registry.protocol.verify import verify_directory
from registry.rules.words import count


@app.command()
def verify(
    directory: Annotated[str, typer.Argument(help="Directory path or URL (s3://b/p/dir).")],
    full: Annotated[bool, typer.Option("--full", help="Compare the sha256 of every byte "
                                                      "(the default; kept for scripts).")
                    ] = False,
    quick: Annotated[bool, typer.Option("--quick", help="Compare sizes only (fast; a flipped "
                                                        "byte passes).")] = False,
    trusted_key: Annotated[list[str] | None, trusted_key_option(
        "Public key (PEM) this host trusts (repeatable): the directory's model.sig must "
        "verify under one of them, for the model id and version its manifest names (and "
        "that a store's release folder is named for).")] = None,
    trusted_keys: TrustedKeysOpt = None,
    trusted_ca: TrustedCaOpt = None,
    trusted_cas: TrustedCasOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Check that DIRECTORY is committed and every file matches its MANIFEST.json.

    Every byte is hashed by default (by pieces, on every core); --quick compares
    sizes only. With trusted keys (or CAs) the manifest must also carry a valid
    model.sig, as pull requires. Exits 0 when it verifies, 1 when it does not
    (one line per failing file) or the signature is refused.
    """
    with error_boundary(as_json):
        if full and quick:
            from registry.errors import UsageError

            raise UsageError("--full and --quick: give at most one")
        full = not quick
        store = open_store(directory)
        if nothing_stored(store, ""):
            raise ObjectNotFoundError(f"{store.url}: no such directory (nothing stored there)",
                                      key=store.url)
        trust = host_trust(trusted_key, trusted_keys, trusted_ca, trusted_cas)
        report = verify_directory(store, "", full=full)
        signed = None
        if trust is not None and report.manifest is not None:
            from registry.trust.directory import check_directory_signature

            signed = check_directory_signature(store, report.manifest, trust)
    if as_json:
        doc = report.to_dict()
        if signed is not None:
            doc["signature"] = signed
        print_json(doc)
    else:
        if report.error is not None:
            echo(f"NOT COMMITTED {report.error}")
        for p in report.problems:
            echo(f"FAIL {shown(p.path)}: {shown(p.reason)}")
        for extra in report.extras:
            echo(f"EXTRA {shown(extra)}: not listed in MANIFEST.json")
        if report.ok:
            m = report.manifest
            assert m is not None
            mode = "sha256" if full else "sizes"
            echo(f"OK {store.url}: {count(len(m.files), 'file')}, {m.total_size} bytes, "
                       f"{mode} verified, manifest sha256 {m.digest}"
                 + (f", signed by {signed}" if signed else ""))
    if not report.ok:
        why = (str(report.error) if report.error is not None
               else f"{count(len(report.problems), 'file')} "
               f"{'differs' if len(report.problems) == 1 else 'differ'} from MANIFEST.json"
               if report.problems else f"{count(len(report.extras), 'file')} not in MANIFEST.json")
        fail(f"{store.url}: does not verify: {why}", EXIT_FAILED, as_json=as_json,
             path=store.url)
