"""``registry cache ls|prune|verify``: the serving host's pull cache and its disk."""

from __future__ import annotations

from typing import Annotated

import typer

from registry.rules.numbers import INT_MAX
from registry.cli.app import JsonOpt, RegistryTyper, app, print_json
from registry.cli.errors import EXIT_FAILED, at_least, error_boundary, fail
from registry.cli.output import echo
from registry.lifecycle.gc import parse_duration
from registry.pull.cache_admin import PullCache
from registry.pull.cache_table import human, table
from registry.rules.words import count

cache_app = RegistryTyper(help="The pull cache of this host: list, prune, verify.",
                          no_args_is_help=True)
app.add_typer(cache_app, name="cache")

CacheOpt = Annotated[str | None, typer.Option(
    "--cache", envvar="REGISTRY_CACHE", metavar="PATH",
    help="Cache directory [default: ~/.cache/model-registry].")]


@cache_app.command("ls")
def ls(cache: CacheOpt = None, as_json: JsonOpt = False) -> None:
    """List the cached releases: size, blobs shared with other versions, last pull, directories.

    Sizes are apparent sizes (powers of 1024 in text). A directory inside the
    cache is shown as ``cache``; a --to directory by its path, with
    ``(replaced)`` or ``(missing)`` when it no longer holds the release.
    Then the cache's filesystem (free space), the totals and the unfinished
    downloads in tmp/ (a mirror's fills running now or kept to be resumed)."""
    with error_boundary(as_json):
        report = PullCache(cache).ls()
    if as_json:
        print_json(report.to_dict())
        return
    if not report.versions and not report.blobs:
        echo(f"no release in the cache {report.cache}", err=True)
        return
    for line in table(report, disk=True):
        echo(line)


@cache_app.command("prune")
def prune(
    keep_last: Annotated[int | None, typer.Option(
        "--keep-last", metavar="N", max=INT_MAX, help="Keep each model's N most recently pulled versions; "
                                         "prune the others.")] = None,
    older_than: Annotated[str | None, typer.Option(
        "--older-than", metavar="DURATION",
        help="Prune versions last pulled longer ago than this; the unit is required "
             "(90s, 15m, 2h, 30d, 2w).")] = None,
    max_size: Annotated[str | None, typer.Option(
        "--max-size", metavar="SIZE",
        help="Then prune least recently pulled versions until the cache fits "
             "(50G, 512M; powers of 1024).")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List, delete nothing.")] = False,
    store: Annotated[str | None, typer.Option(
        "--store", envvar="REGISTRY_STORE", metavar="URL",
        help="The store the releases came from: cached releases it deleted (`registry "
             "release delete`, a tombstone with their manifest digest) are pruned too, "
             "whatever the other options say.")] = None,
    cache: CacheOpt = None, as_json: JsonOpt = False,
) -> None:
    """Remove cached releases and the blobs only they use; unreferenced blobs always.

    With --keep-last and --older-than both, a version goes when it is older
    and not among its model's last N. A directory a pruned release was
    materialized into inside the cache is deleted; a --to directory is kept
    and forgotten. Releases being pulled right now are never pruned."""
    with error_boundary(as_json):
        at_least("--keep-last", keep_last, 0)
        seconds = None if older_than is None else parse_duration(older_than,
                                                                 what="--older-than")
        s = None
        if store is not None:
            from registry.store import open_store

            s = open_store(store)
        report = PullCache(cache).prune(keep_last=keep_last, older_than=seconds,
                                        max_size=max_size, dry_run=dry_run, store=s)
    if as_json:
        print_json(report.to_dict())
        return
    verb = "would prune" if dry_run else "pruned"
    for p in report.pruned:
        removed, forgot = ("would remove", "would forget") if dry_run else ("removed", "forgot")
        extra = "".join([*(f"; {removed} {d}" for d in p.removed_dirs),
                         *(f"; {forgot} {d} (kept on disk)" for d in p.forgotten_dirs)])
        echo(f"{verb} {p.model_id}@{p.version} (last pulled {p.last_pulled}, "
                   f"{', '.join(p.reasons)}){extra}")
    for s in report.skipped_in_use:
        echo(f"kept {s}: a pull of it is in progress")
    if not report.pruned and not report.blobs_removed:
        echo(f"nothing to prune in {report.cache}", err=True)
    else:
        echo(f"{'would free' if dry_run else 'freed'} {human(report.bytes_freed)} "
             f"({count(report.blobs_removed, 'blob')}): {human(report.size_before)} -> "
                   f"{human(report.size_after)}")
    if report.max_size_met is False:
        echo(f"warning: still over --max-size {max_size}: what is left is kept by "
                   "--keep-last or being pulled", err=True)


@cache_app.command("verify")
def verify(
    workers: Annotated[int | None, typer.Option(
        "--workers", max=INT_MAX, help="Blobs hashed at once [default: the CPU count].")] = None,
    cache: CacheOpt = None, as_json: JsonOpt = False,
) -> None:
    """Re-hash every blob of the cache; remove the bad ones (the next pull fetches them again).

    Exits 0 when every blob verified, 1 when some did not (one line per bad blob)."""
    with error_boundary(as_json):
        at_least("--workers", workers, 1)
        report = PullCache(cache).verify(workers=workers)
    if as_json:
        print_json(report.to_dict())
    else:
        for b in report.bad:
            used = ", ".join(b.used_by) or "no cached release"
            action = "removed" if b.removed else "kept for now (a pull in progress uses it)"
            echo(f"BAD blobs/sha256/{b.sha256}: {b.size} bytes hash to "
                       f"{b.actual_sha256 or 'unreadable'} (used by {used}); {action}")
        if report.ok:
            echo(f"OK {report.cache}: {count(report.blobs, 'blob')}, {report.bytes} bytes, "
                       f"sha256 verified, {report.seconds:.2f} s")
    if not report.ok:
        fail(f"{report.cache}: {count(len(report.bad), 'blob')} did not verify "
             f"({sum(b.removed for b in report.bad)} removed)", EXIT_FAILED,
             as_json=as_json, path=report.cache)
