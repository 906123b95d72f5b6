"""``registry gc``: abandoned claims, staging directories and uncommitted leftovers."""

from __future__ import annotations

from typing import Annotated

import typer

from registry.cli.app import JsonOpt, StoreOpt, app, nothing_stored, print_json
from registry.cli.errors import error_boundary
from registry.cli.output import echo
from registry.cli.progress import ProgressOpt, reporter
from registry.errors import ObjectNotFoundError
from registry.lifecycle.gc import collect, parse_duration
from registry.store import open_store


@app.command()
def gc(older_than: Annotated[str, typer.Option("--older-than", metavar="DURATION",
                                               help="Only leftovers older than "
                                                    "this; the unit is required "
                                                    "(90s, 15m, 2h, 7d).")] = "1h",
       dry_run: Annotated[bool, typer.Option("--dry-run", help="List, delete nothing.")] = False,
       checkpoint_path: Annotated[list[str] | None, typer.Option(
           "--checkpoint-path", metavar="PATH",
           help="Also scan this LoongSage checkpoint tree (relative to "
                "the store; repeatable).")] = None,
       break_claims: Annotated[bool, typer.Option(
           "--break-claims", help="Also remove claims whose lease is still live (their "
                                  "writers are known to be gone).")] = False,
       purge_versions: Annotated[bool, typer.Option(
           "--purge-versions", help="On a bucket with versioning or object lock on: also "
                                    "delete every noncurrent version and delete marker under "
                                    "the store (what was deleted or replaced is otherwise "
                                    "still stored, billed and readable; see "
                                    "docs/s3-servers.md).")] = False,
       store: StoreOpt = None, as_json: JsonOpt = False, progress: ProgressOpt = None) -> None:
    """Remove abandoned claims, staging dirs, uncommitted leftovers and the
    temporary files of killed event appends (events/.tmp-*); never a commit.

    Ages are measured on the store's clock (a probe object), never this
    host's; when this host's clock is further from the store's than
    REGISTRY_CLOCK_TOLERANCE (60 s), claims are left alone and a warning
    says so."""
    with error_boundary(as_json), reporter(progress, as_json, "gc") as bar:
        s = open_store(store)
        seconds = parse_duration(older_than, what="--older-than")
        for tree in checkpoint_path or []:
            if nothing_stored(s, tree.strip("/")):
                raise ObjectNotFoundError(f"{s.url_of(tree.strip('/'))}: no such checkpoint "
                                          "tree (nothing there)", key=tree.strip("/"))
        notes: list[str] = []
        removed = collect(s, older_than=seconds, dry_run=dry_run,
                          trees=checkpoint_path or [], break_claims=break_claims,
                          warn=notes.append, purge_versions=purge_versions, progress=bar)
    if as_json:
        print_json({"removed": [s.url_of(k) for k in removed], "dry_run": dry_run,
                    "warnings": notes, "skipped": s.skipped})
    else:
        for note in notes:
            echo(f"warning: {note}", err=True)
        for why in s.skipped:
            echo(f"warning: skipped {why}", err=True)
        for k in removed:
            echo(f"{'would remove' if dry_run else 'removed'} {s.url_of(k)}")
        if not removed:
            echo(f"nothing to remove in {s.url} (no leftover older than {older_than})",
                       err=True)
