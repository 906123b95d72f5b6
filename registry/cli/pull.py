"""``registry pull``: a verified model directory on this host, from local disk or S3."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from registry.refs.aliases import parse_ref, resolve
from registry.cli.app import JsonOpt, StoreOpt, app, print_json
from registry.cli.errors import at_least, error_boundary
from registry.cli.oci import InsecureOpt, InsecureRemoteOpt, PasswordStdinOpt, UsernameOpt
from registry.cli.output import echo
from registry.cli.progress import ProgressOpt, reporter
from registry.cli.trustopts import TrustedCaOpt, TrustedCasOpt, TrustedKeysOpt, host_trust
from registry.cli.trustopts import trusted_key_option
from registry.errors import GateFailedError, InvalidNameError, UsageError
from registry.pull import pull as do_pull
from registry.gating.gates import GateResult
from registry.store import Store, open_store
from registry.rules.words import count


@app.command()
def pull(
    ref: Annotated[str, typer.Argument(
        help="MODEL_ID@VERSION or MODEL_ID@ALIAS (a bare MODEL_ID means its alias main, else "
             "its newest release passing its gates), or an OCI artifact: "
             "oci://HOST/REPO(:TAG|@sha256:HEX).")],
    to: Annotated[str | None, typer.Option("--to", metavar="PATH",
                                           help="Model directory to create "
                                                "(default: inside the cache).")] = None,
    cache: Annotated[str | None, typer.Option("--cache", envvar="REGISTRY_CACHE", metavar="PATH",
                                              help="Cache directory [default: "
                                                   "~/.cache/model-registry].")] = None,
    workers: Annotated[int, typer.Option("--workers", help="Parallel downloads.")] = 8,
    verify: Annotated[bool, typer.Option("--verify", help="Re-hash every file "
                                                          "materialized.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Replace a target directory "
                                                        "holding other content.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar; print only the "
                                                        "model directory's path.")] = False,
    range_threshold_mib: Annotated[int, typer.Option(
        "--range-threshold-mib", metavar="MIB",
        help="Files larger than this many MiB may be split into "
             "parallel byte ranges (when their stream is slow "
             "enough for that to pay).")] = 64,
    no_fsync: Annotated[bool, typer.Option(
        "--no-fsync", help="Do not fsync downloaded blobs (for disks that do not outlive "
                           "the host, e.g. a pod's emptyDir): faster, but a power loss "
                           "can leave damaged files.")] = False,
    blobs: Annotated[bool, typer.Option(
        "--blobs", help="Keep a verified blob of every downloaded file in the cache (later "
                        "pulls of other versions share it) and copy it into the target: two "
                        "writes per byte. The default for object stores.")] = False,
    no_blobs: Annotated[bool, typer.Option(
        "--no-blobs", help="Download files the cache lacks straight into the target, keeping "
                           "no blob: one write per byte. The default for a local store "
                           "(already a verified copy on this host); see REGISTRY_PULL_BLOBS.")
    ] = False,
    require_passing: Annotated[bool, typer.Option(
        "--require-passing", help="Refuse (exit 1, nothing downloaded) a release that fails "
                                  "its gates now (revoked source, policy).")] = False,
    allow_yanked: Annotated[bool, typer.Option(
        "--allow-yanked", help="Pull a yanked release (`registry yank`) anyway; without it "
                               "a yanked release is refused (exit 1, nothing downloaded). "
                               "--require-passing refuses it whatever this says.")] = False,
    trusted_key: Annotated[list[str] | None, trusted_key_option(
        "Public key (PEM) this host trusts (repeatable): the release must be signed by one "
        "of them (model.sig), else nothing is placed.")] = None,
    trusted_keys: TrustedKeysOpt = None, trusted_ca: TrustedCaOpt = None,
    trusted_cas: TrustedCasOpt = None,
    mirror: Annotated[str | None, typer.Option(
        "--from", envvar="REGISTRY_MIRROR", metavar="URL",
        help="Pull through a `registry serve` mirror (http://HOST:PORT) with the same checks "
             "(manifest, sha256 of every byte, signature); when it cannot be reached, pull "
             "from --store / REGISTRY_STORE if one is given. $HF_TOKEN is sent as its "
             "bearer token.")] = None,
    hub_namespace: Annotated[str, typer.Option(
        "--hub-namespace", metavar="NAME",
        help="With --from: the mirror's --hub-namespace.")] = "registry",
    offline: Annotated[bool, typer.Option(
        "--offline", envvar="REGISTRY_OFFLINE",
        help="Use only the cache: resolve the ref as the last pull of it did, re-check the "
             "cached files (stamps, re-hash when changed) and place them; no store, no "
             "network, no gate re-evaluation. A ref never pulled into this cache is an "
             "error (exit 3).")] = False,
    insecure: InsecureOpt = False, insecure_remote: InsecureRemoteOpt = False,
    username: UsernameOpt = None, password_stdin: PasswordStdinOpt = False,
    store: StoreOpt = None, as_json: JsonOpt = False, progress: ProgressOpt = None,
) -> None:
    """Download, verify and place a release where the engine reads it (needs no index).

    A release that fails its gates now (a data source revoked since, a policy
    threshold it misses) is pulled with a warning naming the failing gate, or
    refused with --require-passing."""
    if ref.startswith("oci://"):  # registry.oci: the same pull over an OCI artifact
        from registry.cli.oci import pull_command

        return pull_command(ref, ignored={"--offline": offline,
                                          "--require-passing": require_passing,
                                          "--allow-yanked": allow_yanked},
                            to=to, cache=cache, workers=workers, verify=verify,
                            force=force, quiet=quiet, fsync=not no_fsync,
                            blobs=True if blobs else (False if no_blobs else None),
                            range_threshold=range_threshold_mib * 1024 * 1024,
                            trust_args=(trusted_key, trusted_keys, trusted_ca, trusted_cas),
                            insecure=insecure, insecure_remote=insecure_remote,
                            username=username, password_stdin=password_stdin,
                            as_json=as_json, progress=progress)
    with error_boundary(as_json):
        model_id, given = parse_ref(ref)
        name = given or ""  # a bare model id: registry.pull.opened.default_version
        at_least("--workers", workers, 1)
        if blobs and no_blobs:
            raise UsageError("--blobs and --no-blobs: give at most one")
        if range_threshold_mib < 0:
            raise UsageError(f"--range-threshold-mib {range_threshold_mib}: must not be "
                             "negative (0: any file may be split)")
        trust = host_trust(trusted_key, trusted_keys, trusted_ca, trusted_cas)
        if offline:
            from registry.pull.cache import Cache
            from registry.pull.offline import CacheStore, recall

            c = Cache(cache)
            version, manifest = recall(c, model_id, name or "main")
            s: Store = CacheStore(c, model_id, version, manifest)
            failed: list[GateResult] = []
            hint: list[GateResult] | None = []
        else:
            s, version, hint = _source(mirror, hub_namespace, store, model_id, name, trust)
            failed = hint or []
        if failed and require_passing:
            raise GateFailedError(f"{model_id}@{version}: not pulled (--require-passing)",
                                  failed)
        files: list[int] = []
        with reporter(False if quiet and progress is None else progress, as_json,
                      f"pull {ref}") as shown:
            result = do_pull(s, model_id, version, to=to, cache=cache, workers=workers,
                             verify=verify, force=force, fsync=not no_fsync,
                             blobs=True if blobs else (False if no_blobs else None),
                             range_threshold=range_threshold_mib * 1024 * 1024, trust=trust,
                             ref=name or None, allow_yanked=allow_yanked or offline,
                             gates=not offline and hint is None, require_passing=require_passing
                             and not offline and hint is None,
                             on_files=files.append,
                             on_start=lambda total: shown.start("pull", files=files[-1],
                                                                total=total),
                             progress=shown.advance)
            shown.finish()
        if not offline and hint is None:
            failed = list(result.failing)
    if as_json:
        print_json({**result.to_dict(), "passing": not failed, "offline": offline,
                    "failing_gates": [r.to_dict() for r in failed]})
        return
    if offline and not quiet:
        typer.echo(f"offline: {ref} resolved from the cache to {result.version} (as its last "
                   "pull); gates not re-evaluated", err=True)
    if failed:
        from registry.release.failing import describe

        echo(f"warning: {model_id}@{result.version} fails its gates now "
                   f"({describe(failed)}); pulled anyway (--require-passing refuses)", err=True)
    mbps = result.transferred / 1e6 / result.seconds if result.seconds > 0 else 0.0
    if not quiet:
        echo(f"pulled {model_id}@{result.version} to {result.path}: "
             f"{count(result.files, 'file')} "
                   f"({result.downloaded} downloaded), {result.bytes} bytes "
                   f"({result.transferred} transferred), {result.seconds:.2f} s, "
                   f"{mbps:.1f} MB/s" + (", every file re-hashed" if result.rehashed else "")
                   + (f", signed by {_signer(result.signed_by)}" if result.signed_by else "")
                   + _records(result.freshness))
    else:
        echo(result.path)


def _records(freshness: str) -> str:
    """The summary's last words on what protects the release's records."""
    if not freshness:
        return ""
    if freshness.startswith("signed snapshot"):
        return f"; records: {freshness.split(' (', 1)[0]}"
    return "; records: trust on first use (no signed snapshot checked)"


def _source(mirror: str | None, namespace: str, store: str | None, model_id: str,
            name: str, trust: Any = None) -> tuple[Store, str, list[GateResult] | None]:
    """The store to pull from, the name to pull there, and the gates it fails
    now (None: the pull evaluates them itself, through the trust function).

    Through a mirror its answer is a hint: without trust, the version it names
    is pulled (by version, never by alias, so a move mid-pull cannot mix
    two releases) and its verdict on the gates is taken (it refuses failing
    releases unless started with --allow-failing); with trust, the alias is
    resolved by :func:`registry.trust.release.open_release` from the signed
    move the mirror must hand over, never from the version it names. A mirror
    that cannot be reached falls back to the store when one is configured."""
    if mirror:
        from registry.pull.mirror_store import MirrorDownError, MirrorStore

        ms = MirrorStore(mirror, namespace=namespace)
        try:
            doc = ms.revision(model_id, name or "main").get("registry", {})
        except MirrorDownError as e:
            if store is None:
                raise
            typer.echo(f"warning: {e}; pulling from the store {store}", err=True)
        else:
            version = str(doc.get("version") or "")
            if not version:
                raise InvalidNameError(f"{mirror}: answered for {model_id}@{name} without a "
                                       "registry version (not a registry serve?)", name=name)
            failed = [] if doc.get("passing", True) else [
                GateResult("gates", False, "the mirror reports it fails its gates now")]
            return ms, (name if trust is not None else resolve(ms, model_id, version)), failed
    return open_store(store), name, None


def _signer(check: dict[str, Any]) -> str:
    if check["kind"] == "certificate":
        return (f"certificate {check['identity']!r} ({check['fingerprint']}) from CA "
                f"{check['ca']!r}")
    return f"key {check['fingerprint']}"
