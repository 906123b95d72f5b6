"""``registry yank``, ``unyank``, ``release delete``, ``release gc``, ``tag`` (issue 32 items 1-3)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer

from registry.cli.app import DbOpt, JsonOpt, RegistryTyper, StoreOpt, app, print_json
from registry.cli.errors import error_boundary, index_writes, report_not_indexed
from registry.cli.output import echo
from registry.cli.release import release_app
from registry.cli.snapshot import SnapshotKeyOpt, report
from registry.cli.snapshot import signed as _signed
from registry.protocol.layout import release_prefix

if TYPE_CHECKING:
    from registry.api import Registry

RefArg = Annotated[str, typer.Argument(help="MODEL_ID@VERSION (or MODEL_ID@ALIAS).")]
ReasonOpt = Annotated[str, typer.Option("--reason", metavar="REASON",
                                        help="Why, recorded with who and when (required).")]


def _registry(store: str | None, db: str | None) -> Registry:
    from registry.api import Registry

    return Registry(store, db)


def _who(doc: dict[str, Any]) -> str:
    from registry.host.actor import describe, read_actor

    return describe(read_actor(doc.get("actor")))


@app.command()
def yank(ref: RefArg, reason: ReasonOpt, sign_key: SnapshotKeyOpt = None,
         store: StoreOpt = None, db: DbOpt = None, as_json: JsonOpt = False) -> None:
    """Take a release out of service, its files kept (`registry unyank` undoes it).

    A yanked release fails the yanked gate everywhere (alias moves, pull
    --require-passing, queries, the web) and a plain pull refuses it
    (--allow-yanked pulls it)."""
    with error_boundary(as_json), index_writes():
        reg = _registry(store, db)
        model_id, version = reg.resolve(ref)
        doc, changed = reg.yank(model_id, version, reason, sign_key=sign_key)
    if as_json:
        print_json({**doc, "changed": changed, **_signed(reg.snapshots)})
    elif changed:
        echo(f"yanked {model_id}@{version}: {doc['reason']}")
    else:
        echo(f"{model_id}@{version} was already yanked ({doc.get('at')} by {_who(doc)}: "
             f"{doc.get('reason')})")
    if not as_json:
        report(reg.snapshots)
    report_not_indexed(reg.index_errors, store=store, db=db, as_json=as_json)


@app.command()
def unyank(ref: RefArg,
           reason: Annotated[str | None, typer.Option("--reason", metavar="REASON",
                                                      help="Why (optional).")] = None,
           sign_key: SnapshotKeyOpt = None,
           store: StoreOpt = None, db: DbOpt = None, as_json: JsonOpt = False) -> None:
    """Put a yanked release back in service (recorded, with who and when)."""
    with error_boundary(as_json), index_writes():
        reg = _registry(store, db)
        model_id, version = reg.resolve(ref)
        doc, changed = reg.unyank(model_id, version, reason=reason, sign_key=sign_key)
    if as_json:
        print_json({**doc, "changed": changed, **_signed(reg.snapshots)})
    else:
        echo(f"unyanked {model_id}@{version}" if changed
             else f"{model_id}@{version} is not yanked")
        report(reg.snapshots)
    report_not_indexed(reg.index_errors, store=store, db=db, as_json=as_json)


@release_app.command("delete")
def release_delete(ref: RefArg, reason: ReasonOpt, sign_key: SnapshotKeyOpt = None,
                   store: StoreOpt = None, db: DbOpt = None, as_json: JsonOpt = False,
                   purge_versions: Annotated[bool, typer.Option(
                       "--purge-versions",
                       help="On a bucket with versioning or object lock on: also delete the "
                            "release's noncurrent versions and delete markers (else its "
                            "bytes stay stored and readable; see docs/s3-servers.md)."
                   )] = False) -> None:
    """Delete a release (MANIFEST.json first), leaving a tombstone (who, when, why, the
    manifest digest): its version name is never reused. Refused while an alias
    points at it. Running it again finishes a delete that was interrupted."""
    with error_boundary(as_json), index_writes():
        reg = _registry(store, db)
        from registry.refs.aliases import parse_ref
        from registry.errors import InvalidNameError

        model_id, name = parse_ref(ref)
        if name is None:
            raise InvalidNameError(f"{ref!r}: expected MODEL_ID@VERSION", name=ref)
        from registry.lifecycle.tombstone import is_deleted

        version = name if is_deleted(reg.store, model_id, name) else reg.resolve(ref)[1]
        doc, deleted = reg.delete_release(model_id, version, reason, sign_key=sign_key)
        notes: list[str] = []
        from registry.lifecycle.gc import versions

        purged = versions(reg.store, release_prefix(model_id, version), purge=purge_versions,
                          warn=notes.append)
    for note in notes if not as_json else ():
        echo(f"warning: {note}", err=True)
    if as_json:
        print_json({**doc, "deleted_now": deleted, "purged_versions": purged,
                    "warnings": notes, **_signed(reg.snapshots)})
    elif deleted:
        echo(f"deleted {model_id}@{version} (manifest sha256 {doc['manifest_sha256']}); "
             f"tombstone kept: {doc['reason']}")
    else:
        echo(f"{model_id}@{version} was already deleted ({doc.get('deleted_at')} by "
             f"{_who(doc)}); what was left of it is removed")
    if purged and not as_json:
        echo(f"purged {len(purged)} noncurrent version(s) of {model_id}@{version}")
    if not as_json:
        report(reg.snapshots)
    report_not_indexed(reg.index_errors, store=store, db=db, as_json=as_json)


@release_app.command("gc")
def release_gc(
    keep_last: Annotated[int | None, typer.Option(
        "--keep-last", metavar="N", help="Keep the N newest releases of each model.")] = None,
    unaliased: Annotated[bool, typer.Option(
        "--unaliased", help="Delete releases no alias points at (aliased ones are never "
                            "deleted, whatever the other options say).")] = False,
    older_than: Annotated[str | None, typer.Option(
        "--older-than", metavar="DURATION",
        help="Only releases committed longer ago than this, by the store's clock "
             "(90s, 15m, 2h, 7d, 2w).")] = None,
    model_id: Annotated[str | None, typer.Option(
        "--model-id", help="Only this model (default: every model).")] = None,
    reason: Annotated[str | None, typer.Option(
        "--reason", metavar="REASON", help="Recorded in each tombstone (default: the "
                                         "policy in words).")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List, delete nothing.")] = False,
    store: StoreOpt = None, db: DbOpt = None, as_json: JsonOpt = False,
) -> None:
    """Apply a retention policy: delete (with tombstones) the releases that match every
    criterion given (at least one is required)."""
    with error_boundary(as_json), index_writes():
        from registry.lifecycle.gc import parse_duration

        seconds = (parse_duration(older_than, what="--older-than")
                   if older_than is not None else None)
        reg = _registry(store, db)
        report = reg.release_gc(keep_last=keep_last, unaliased=unaliased, older_than=seconds,
                                model_id=model_id, dry_run=dry_run, reason=reason)
    if as_json:
        print_json(report.to_dict())
    else:
        for r in report.deleted:
            echo(f"{'would delete' if dry_run else 'deleted'} {r['model_id']}@{r['version']}")
        for r in report.kept:
            echo(f"kept {r['model_id']}@{r['version']}: {r['reason']}")
        if not report.deleted:
            echo("nothing to delete", err=True)
    report_not_indexed(reg.index_errors, store=store, db=db, as_json=as_json)


tag_app = RegistryTyper(help="Mutable tags of releases (KEY=VALUE).", no_args_is_help=True)
app.add_typer(tag_app, name="tag")


@tag_app.command("set")
def tag_set(ref: RefArg,
            tags: Annotated[list[str], typer.Argument(help="KEY=VALUE pairs (one or more).")],
            store: StoreOpt = None, db: DbOpt = None, as_json: JsonOpt = False) -> None:
    """Set tags on a release (compare-and-swap: concurrent writers all land)."""
    with error_boundary(as_json):
        from registry.lifecycle.tags import parse_assignments

        values = parse_assignments(tags)
    _change_tags(ref, store, db, as_json, lambda reg, m, v: reg.set_tags(m, v, values))


@tag_app.command("rm")
def tag_rm(ref: RefArg,
           keys: Annotated[list[str], typer.Argument(help="Tag keys (one or more).")],
           store: StoreOpt = None, db: DbOpt = None, as_json: JsonOpt = False) -> None:
    """Remove tags from a release (every key must be there)."""
    _change_tags(ref, store, db, as_json, lambda reg, m, v: reg.remove_tags(m, v, keys))


def _change_tags(ref: str, store: str | None, db: str | None, as_json: bool,
                 change: Callable[[Registry, str, str], dict[str, str]]) -> None:
    """``change(registry, model_id, version)`` on the release REF names, then
    print its tags as they are now."""
    with error_boundary(as_json), index_writes():
        reg = _registry(store, db)
        model_id, version = reg.resolve(ref)
        out = change(reg, model_id, version)
    _print_tags(model_id, version, out, as_json)
    report_not_indexed(reg.index_errors, store=store, db=db, as_json=as_json)


@tag_app.command("ls")
def tag_ls(ref: RefArg, store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """List the tags of a release (read from the store)."""
    with error_boundary(as_json):
        from registry.refs.aliases import parse_ref, resolve
        from registry.errors import InvalidNameError
        from registry.lifecycle.tags import read_tags
        from registry.store import open_store

        s = open_store(store)
        model_id, name = parse_ref(ref)
        if name is None:
            raise InvalidNameError(f"{ref!r}: expected MODEL_ID@VERSION", name=ref)
        version = resolve(s, model_id, name)
        out = read_tags(s, model_id, version)
    _print_tags(model_id, version, out, as_json)


def _print_tags(model_id: str, version: str, tags: dict[str, str], as_json: bool) -> None:
    if as_json:
        print_json({"model_id": model_id, "version": version, "tags": tags})
        return
    for k, v in tags.items():
        echo(f"{k}={v}")
    if not tags:
        echo(f"{model_id}@{version} has no tags", err=True)
