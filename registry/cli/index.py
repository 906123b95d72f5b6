"""Index commands: ``db upgrade``, ``index rebuild``, ``ledger``, ``query``, ``show``,
``ls``, ``diff``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from typing import Annotated

import typer

from registry.cli.app import DbOpt, JsonOpt, StoreOpt, RegistryTyper, app, print_json
from registry.cli.errors import error_boundary, index_writes, report_not_indexed
from registry.cli.output import echo, shown
from registry.cli.progress import ProgressOpt, reporter
from registry.errors import RegistryError, UsageError

db_app = RegistryTyper(help="The index database schema.", no_args_is_help=True)
index_app = RegistryTyper(help="The SQL index derived from the store.", no_args_is_help=True)
ledger_app = RegistryTyper(help="The live data ledger (revocations).", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(index_app, name="index")
app.add_typer(ledger_app, name="ledger")


if TYPE_CHECKING:
    from registry.api import Registry


def _registry(store: str | None, db: str | None) -> Registry:
    """The Registry facade, imported on use: SQLAlchemy and Alembic load only
    for the commands that touch the index."""
    from registry.api import Registry

    return Registry(store, db)



@db_app.command("upgrade")
def db_upgrade(db: DbOpt = None, as_json: JsonOpt = False) -> None:
    """Bring the index schema to the newest migration (Alembic head)."""
    from registry.index import Index

    with error_boundary(as_json):
        index = Index(db, check=False)
        head = index.upgrade()
    if as_json:
        print_json({"db": str(index), "revision": head})
    else:
        echo(f"{index}: at revision {head}")


@index_app.command("rebuild")
def index_rebuild(store: StoreOpt = None, db: DbOpt = None, as_json: JsonOpt = False,
                  progress: ProgressOpt = None) -> None:
    """Recompute the whole index from the store alone (local or S3).

    A SQLite file that is not a database (or whose schema no migration can
    finish) is first moved aside (to <file>.damaged-<time>, named in the
    output) and rebuilt from scratch. Nothing indexed is dropped on a
    listing's word: a release missing from the listing is removed only when a
    HEAD of its manifest finds none. Each release skipped (staging, claimed),
    damaged, removed or kept against the listing is printed with the reason."""
    with error_boundary(as_json), reporter(progress, as_json, "index rebuild") as bar:
        reg = _registry(store, db)
        aside = reg.repair_index()
        counts = reg.rebuild_index(progress=bar)
    if as_json:
        # the counts document keeps its shape; a repair adds the file it moved
        print_json({**counts, **({"moved_aside": aside} if aside else {}),
                    **({"skipped": reg.store.skipped} if reg.store.skipped else {})})
        return
    for why in reg.store.skipped:  # links and special files: never followed, not indexed
        typer.echo(f"warning: skipped {why}", err=True)
    if aside is not None:
        echo(f"moved the damaged index aside to {aside}")
    echo(", ".join(f"{v} {k}" for k, v in counts.items() if k != "report"))
    for r in counts["report"]:
        echo(f"{r['action']} {r['what']}: {r['reason']}")


from registry.cli.snapshot import report, signed as _signed  # noqa: E402


@ledger_app.command("revoke")
def ledger_revoke(source_id: Annotated[str, typer.Argument(help="Data source id.")],
                  reason: Annotated[str, typer.Option("--reason", help="Why (kept forever).")],
                  sign_key: Annotated[str | None, typer.Option(
                      "--sign-key", metavar="PATH",
                      help="EC private key (PEM) of a key the reading hosts trust: sign the "
                           "snapshot of every model that has one again, listing the "
                           "revocation (registry snapshot sign).")] = None,
                  store: StoreOpt = None, db: DbOpt = None, as_json: JsonOpt = False) -> None:
    """Revoke a data source: releases trained on it stop passing the gates at once."""
    with error_boundary(as_json), index_writes():
        reg = _registry(store, db)
        rev, created = reg.revoke(source_id, reason, sign_key=sign_key)
    from registry.release.failing import failing_aliases  # loads the release builder

    try:  # the revocation is committed: a failing alias scan must not hide that
        failing, unchecked = failing_aliases(reg.store), None
    except RegistryError as e:
        failing, unchecked = [], str(e)
    if as_json:
        print_json({**rev.to_dict(), "created": created,
                    "failing_aliases": [a.to_dict() for a in failing],
                    "aliases_unchecked": unchecked, **_signed(reg.snapshots)})
    else:
        echo(f"revoked {source_id} at {rev.revoked_at}: {rev.revocation_reason}"
                   + ("" if created else " (already revoked)"))
        for a in failing:
            where = "" if a.version is None else f" -> {a.version} fails its gates now"
            echo(f"warning: alias {a.model_id}@{a.alias}{where} ({a.reason}); move it with "
                 "`registry alias set`", err=True)
        if unchecked is not None:
            echo(f"warning: the aliases could not be checked: {unchecked}", err=True)
        report(reg.snapshots)
    report_not_indexed(reg.index_errors, store=store, db=db, as_json=as_json)


@ledger_app.command("ls")
def ledger_ls(store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """List revoked sources (from the store)."""
    with error_boundary(as_json):
        from registry.facade.documents import revocation_list
        from registry.store import open_store

        s = open_store(store)
        revs = revocation_list(s)
    if as_json:
        print_json(revs)
    else:
        for r in revs:
            echo(f"{r['source_id']}\t{r['revoked_at']}\t{r['revocation_reason']}")
        if not revs:
            echo(f"no data source is revoked in {s.url}", err=True)


@app.command()
def query(
    model_id: Annotated[str | None, typer.Argument(help="Model id.")] = None,
    passing: Annotated[bool, typer.Option("--passing", help="Versions passing every gate "
                                                            "now.")] = False,
    require: Annotated[list[str] | None, typer.Option(
        "--require", metavar="METRIC>=VALUE",
        help="Extra threshold METRIC>=VALUE (repeatable).")] = None,
    latest: Annotated[bool, typer.Option("--latest", help="Only the newest.")] = False,
    source: Annotated[str | None, typer.Option("--source", metavar="SOURCE_ID",
                                               help="Releases trained on this "
                                                    "data source; when no source has this "
                                                    "exact id, on its family (books: "
                                                    "books-2025, books_v2...). With --tag, "
                                                    "--since or --dtype: exact, and also a "
                                                    "source run id or URI.")
                      ] = None,
    tag: Annotated[list[str] | None, typer.Option(
        "--tag", metavar="KEY=VALUE", help="Releases carrying this tag (KEY alone: any "
                                           "value; repeatable, all must match).")] = None,
    since: Annotated[str | None, typer.Option(
        "--since", metavar="WHEN", help="Releases created at or after WHEN: a date or time "
                                        "(2026-11-30, 2026-11-30T12:00:00Z) or a duration "
                                        "back from now (7d, 12h).")] = None,
    dtype: Annotated[str | None, typer.Option(
        "--dtype", help="Releases whose stored dtype is (or includes) this: f32, bf16, "
                        "f16, int4.")] = None,
    store: StoreOpt = None, db: DbOpt = None, as_json: JsonOpt = False,
) -> None:
    """Ask the index: MODEL_ID --passing [--require M>=V] [--latest], --source ID, or a
    search: [MODEL_ID] with any of --tag, --since, --dtype, --source (all must match)."""
    searching = bool(tag) or since is not None or dtype is not None
    with error_boundary(as_json):
        reg = _registry(store, db)
        if searching and passing:
            raise UsageError("query: --passing does not combine with --tag, --since, --dtype")
        if searching:
            rows = reg.search(model_id=model_id, tags=tag or [], since=since, dtype=dtype,
                              source=source)
        elif source is not None:
            rows = reg.releases_for_source(source)
        elif model_id is not None and passing:
            rows = reg.passing(model_id, require=require or [], latest=latest)
        else:
            raise UsageError("query: give MODEL_ID --passing, or --source SOURCE_ID")
    if as_json:
        print_json(rows)
        return
    if searching:
        for r in rows:
            tags = " ".join(f"{k}={v}" for k, v in r["tags"].items())
            echo(f"{r['model_id']}@{r['version']}\t{r['created_at']}\t{r['dtype']}\t"
                 f"{'YANKED' if r['yanked'] else '-'}\t{tags or '-'}")
        if not rows:
            echo("no release in the index matches", err=True)
        return
    if not rows and source is not None:
        echo(f"no release in the index was trained on source {source}", err=True)
    elif source is not None and not searching and rows[0]["source_id"] != source:
        family = sorted({r["source_id"] for r in rows})
        echo(f"no source is named {source} exactly: showing the releases of "
             f"{', '.join(family)}", err=True)
    elif not rows:
        extra = f" with {', '.join(require)}" if require else ""
        echo(f"no version of {model_id} passes its gates{extra} now", err=True)
    for r in rows:
        if source is not None:  # a family's releases also say which source
            which = f"\t{r['source_id']}" if r["source_id"] != source else ""
            echo(f"{r['model_id']}@{r['version']}\t{r['created_at']}\t{r['uri']}{which}")
        else:
            echo(f"{model_id}@{r['version']}\t{r['created_at']}\t{r['dtype']}\t"
                       f"{r['manifest_sha256']}")


def _ref(reg: Registry, ref: str) -> tuple[str, str]:
    return reg.resolve(ref)


@app.command()
def show(ref: Annotated[str, typer.Argument(help="MODEL_ID@VERSION or MODEL_ID@ALIAS.")],
         store: StoreOpt = None, db: DbOpt = None, as_json: JsonOpt = False) -> None:
    """Manifest summary, each gate with its reason, evals and sources of a release."""
    from registry.cli import reads

    with error_boundary(as_json):
        doc = reads.show_doc(store, db, ref)
    reads.print_show(doc, as_json)


@app.command("ls")
def ls_cmd(model_id: Annotated[str | None, typer.Argument(
               help="Model id (NAME or ORG/NAME); ORG/ lists the models of ORG.")] = None,
           store: StoreOpt = None, db: DbOpt = None, as_json: JsonOpt = False) -> None:
    """List models (or those of ORG/), or the releases of MODEL_ID (newest first, passing or not).

    From the index; the store gives the signature gate of a model whose policy
    requires a signature (as for query --passing)."""
    from registry.cli import reads

    with error_boundary(as_json):
        rows, reg = reads.ls_rows(store, db, model_id)
    reads.print_ls(rows, model_id, reg, as_json)


@app.command()
def diff(a: Annotated[str, typer.Argument(help="MODEL_ID@A")],
         b: Annotated[str, typer.Argument(help="MODEL_ID@B")],
         store: StoreOpt = None, db: DbOpt = None, as_json: JsonOpt = False) -> None:
    """Files added, removed and changed (sha256) between two releases; eval deltas."""
    with error_boundary(as_json):
        reg = _registry(store, db)
        ma, va = _ref(reg, a)
        mb, vb = _ref(reg, b)
        if ma != mb:
            raise UsageError(f"{a} and {b} are releases of different models")
        doc = reg.diff(ma, va, vb)
    if as_json:
        print_json(doc)
        return
    for key, mark in (("added", "+"), ("removed", "-"), ("changed", "~")):
        for path in doc[key]:
            echo(f"{mark} {shown(path)}")
    for e in doc["evals"]:
        delta = f"{e['delta']:+g}" if e["delta"] is not None else "n/a"
        a_val, b_val = (f"{v:g}" if v is not None else "absent" for v in (e["a"], e["b"]))
        echo(f"  eval {e['metric']}: {a_val} -> {b_val} ({delta})")
