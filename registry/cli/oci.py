"""``registry push`` and ``registry import``: releases to and from OCI registries.

``registry pull oci://...`` is :func:`pull_from_oci`, called by ``registry pull``.
"""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from registry.cli.app import DbOpt, JsonOpt, StoreOpt, app, print_json
from registry.cli.errors import at_least, error_boundary, index_writes
from registry.cli.output import echo
from registry.cli.release import SignKeyOpt, _gate_failures, _registry, _report
from registry.cli.trustopts import TrustedKeysOpt, host_trust, trusted_key_option
from registry.errors import InvalidNameError, UsageError

InsecureOpt = Annotated[bool, typer.Option(
    "--insecure", help="Plain HTTP instead of HTTPS; only for a loopback registry unless "
                       "--allow-insecure-remote.")]
InsecureRemoteOpt = Annotated[bool, typer.Option(
    "--allow-insecure-remote", help="With --insecure: plain HTTP to a host that is not "
                                    "loopback (credentials and model in clear).")]
UsernameOpt = Annotated[str | None, typer.Option(
    "--username", metavar="NAME", help="Registry user; the password is read from stdin "
                                       "(--password-stdin). Default: the Docker config and "
                                       "its credential helpers.")]
PasswordStdinOpt = Annotated[bool, typer.Option(
    "--password-stdin", help="Read the password for --username from stdin.")]


def client_for(text: str, *, insecure: bool, insecure_remote: bool, username: str | None,
               password_stdin: bool) -> Any:
    """(OciRef, OciClient) for an ``oci://`` reference and the login options."""
    from registry.oci.auth import Credentials
    from registry.oci.client import OciClient
    from registry.oci.ref import parse_ref

    ref = parse_ref(text)
    if password_stdin and username is None:
        raise UsageError("--password-stdin: give --username too")
    password = sys.stdin.readline().rstrip("\r\n") if password_stdin else None
    creds = Credentials(username, password) if username is not None else Credentials()
    if username is not None and password is None:
        raise UsageError("--username: give the password on stdin with --password-stdin")
    return ref, OciClient(ref, insecure=insecure, allow_insecure_remote=insecure_remote,
                          credentials=creds)


@app.command()
def push(
    ref: Annotated[str, typer.Argument(help="MODEL_ID@VERSION or MODEL_ID@ALIAS.")],
    target: Annotated[str, typer.Argument(help="oci://HOST[:PORT]/REPO[:TAG] (default tag: "
                                               "the version).")],
    tag_alias: Annotated[bool, typer.Option(
        "--tag-alias", help="When REF names an alias, also tag the manifest with it.")] = False,
    workers: Annotated[int, typer.Option("--workers", help="Parallel blob uploads.")] = 4,
    mount_from: Annotated[str | None, typer.Option(
        "--mount-from", metavar="REPO",
        help="Mount blobs from this repository of the same registry when it has them.")
    ] = None,
    chunk_mib: Annotated[int | None, typer.Option(
        "--chunk-mib", metavar="MIB", help="Upload blobs in PATCH chunks of this many MiB "
                                           "(default: one streaming PUT per blob).")] = None,
    allow_failing: Annotated[bool, typer.Option(
        "--allow-failing", help="Push a release that fails its gates now.")] = False,
    allow_yanked: Annotated[bool, typer.Option(
        "--allow-yanked", help="Push a yanked release.")] = False,
    insecure: InsecureOpt = False, insecure_remote: InsecureRemoteOpt = False,
    username: UsernameOpt = None, password_stdin: PasswordStdinOpt = False,
    store: StoreOpt = None, as_json: JsonOpt = False,
) -> None:
    """Push a release to an OCI registry as a ModelPack artifact (signature as a referrer)."""
    from registry.refs.aliases import parse_ref as parse_model_ref
    from registry.oci.push import push as do_push
    from registry.store import open_store

    with error_boundary(as_json):
        model_id, name = parse_model_ref(ref)
        if name is None:
            raise InvalidNameError(f"{ref!r}: expected MODEL_ID@VERSION or MODEL_ID@ALIAS",
                                   name=ref)
        at_least("--workers", workers, 1)
        at_least("--chunk-mib", chunk_mib, 1)
        oref, client = client_for(target, insecure=insecure, insecure_remote=insecure_remote,
                                  username=username, password_stdin=password_stdin)
        if oref.digest:
            raise UsageError(f"{target}: push to a tag (or none), not a digest")
        s = open_store(store)
        with client:
            result = do_push(s, model_id, name, oref, client,
                             alias_tag=name if tag_alias else None, workers=workers,
                             mount_from=mount_from,
                             chunk_size=chunk_mib * (1 << 20) if chunk_mib else None,
                             allow_failing=allow_failing, allow_yanked=allow_yanked)
    if as_json:
        print_json(result.to_dict())
        return
    echo(f"pushed {result.model_id}@{result.version} to {result.ref} (tags "
         f"{', '.join(result.tags)}): {result.uploaded} blobs uploaded, {result.present} "
         f"present, {result.mounted} mounted, {result.bytes_sent} bytes sent"
         + (", signature referrer" + ("" if result.referrers_api else
                                      " (sha256-<hex> tag fallback)") if result.signed else
            ", unsigned") + f", {result.seconds:.2f} s")


@app.command("import")
def import_(
    source: Annotated[str, typer.Argument(help="oci://HOST[:PORT]/REPO(:TAG|@sha256:HEX).")],
    model_id: Annotated[str, typer.Option("--model-id", help="Model id to release as.")],
    version: Annotated[str, typer.Option("--version", help="Version to release as.")],
    ledger: Annotated[str | None, typer.Option(
        "--ledger", metavar="PATH", help="Ledger rows (JSON) [default: the artifact's "
                                         "ledger.json].")] = None,
    evals: Annotated[str | None, typer.Option(
        "--evals", metavar="PATH", help="Eval summary (JSON) [default: the artifact's "
                                        "evals/summary.json].")] = None,
    trusted_key: Annotated[list[str] | None, trusted_key_option(
        "Public key (PEM) the artifact's signature must verify with (repeatable).")] = None,
    trusted_keys: TrustedKeysOpt = None,
    sign_key: SignKeyOpt = None,
    cache: Annotated[str | None, typer.Option("--cache", envvar="REGISTRY_CACHE",
                                              metavar="PATH", help="Cache directory.")] = None,
    insecure: InsecureOpt = False, insecure_remote: InsecureRemoteOpt = False,
    username: UsernameOpt = None, password_stdin: PasswordStdinOpt = False,
    store: StoreOpt = None, db: DbOpt = None, as_json: JsonOpt = False,
) -> None:
    """Release an OCI model artifact (ours or another tool's ModelPack) through the gates."""
    from registry.oci.pull import import_oci

    with error_boundary(as_json), _gate_failures(as_json), index_writes():
        oref, client = client_for(source, insecure=insecure, insecure_remote=insecure_remote,
                                  username=username, password_stdin=password_stdin)
        trust = host_trust(trusted_key, trusted_keys)
        reg = _registry(store, db)
        with client:
            result = import_oci(reg, client, oref, model_id, version, ledger=ledger,
                                eval_summary=evals, trust=trust, cache=cache,
                                sign_key=sign_key)
    _report(result, as_json)


def pull_command(ref: str, *, ignored: dict[str, Any], to: str | None, cache: str | None,
                 workers: int, verify: bool, force: bool, quiet: bool, fsync: bool,
                 blobs: bool | None, range_threshold: int,
                 trust_args: tuple[Any, Any, Any, Any], insecure: bool, insecure_remote: bool,
                 username: str | None, password_stdin: bool, as_json: bool,
                 progress: bool | None = None) -> None:
    """``registry pull oci://...``: :func:`registry.oci.pull.pull_oci`, reported
    (its progress included) as a store pull is."""
    from registry.cli.progress import reporter
    from registry.oci.pull import pull_oci

    files: list[int] = []
    with error_boundary(as_json), reporter(False if quiet and progress is None else progress,
                                           as_json, f"pull {ref}") as shown:
        given = [name for name, value in ignored.items() if value]
        if given:
            raise UsageError(f"{', '.join(given)}: not for an oci:// reference (an OCI "
                             "registry has no gates or yanks; `registry pull MODEL@VERSION "
                             "--offline` reads what an oci:// pull cached)")
        at_least("--workers", workers, 1)
        oref, client = client_for(ref, insecure=insecure, insecure_remote=insecure_remote,
                                  username=username, password_stdin=password_stdin)
        trust = host_trust(*trust_args)
        with client:
            result = pull_oci(client, oref, to=to, cache=cache, trust=trust, workers=workers,
                              verify=verify, force=force, fsync=fsync, blobs=blobs,
                              range_threshold=range_threshold, on_files=files.append,
                              on_start=lambda total: shown.start("pull", files=files[-1],
                                                                 total=total),
                              progress=shown.advance)
            shown.finish()
    if as_json:
        print_json({**result.to_dict(), "ref": ref})
        return
    if quiet:
        echo(result.path)
        return
    echo(f"pulled {ref} ({result.model_id}@{result.version}) to {result.path}: "
         f"{result.files} files ({result.downloaded} downloaded), {result.bytes} bytes "
         f"({result.transferred} transferred), {result.seconds:.2f} s"
         + (f", signed by key {result.signer}" if result.signer else ""))
