"""``registry gc``: remove abandoned claims and uncommitted leftovers, never a commit.

Looks at every model folder (``models/<model_id>/``), every run's checkpoint
tree (``runs/<run_id>/ckpt/``) and the event log's temporary files
(``events/.tmp-<id>``, left by an append killed before it linked its event:
by age): staging directories (``*.tmp*``), claims
(``*.claim``) and version or step directories without a valid MANIFEST.json,
older than ``older_than`` seconds (by their newest file). LoongSage trees live
wherever their ``checkpoint_path`` says, so they are scanned only when named
(``trees``), and there only step-shaped names are candidates
(``train_step_<N>``, ``train_step_<N>.tmp*``, ``*.claim``): anything else a
user keeps beside them is left alone. A committed directory is never
touched: it is re-checked right before deletion. A link or special file in
the store is never followed nor entered (registry.store.confine): it is
skipped, and named in ``store.skipped``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

from registry.checkpoint.layout import LOONGSAGE, TINYLLM
from registry.protocol.claim import Claim, read_state
from registry.protocol.commit import delete_directory
from registry.errors import ObjectExistsError, UnsafeEntryError, UsageError
from registry.protocol.layout import (
    CLAIM_SUFFIX,
    EVENTS,
    EVENTS_TMP_PREFIX,
    LATEST,
    MODELS,
    POLICY,
    REFS,
    RUNS,
    TMP_MARK,
    run_root,
)
from registry.store import Store, join, s3versions
from registry.obs.progress import NULL, Progress
from registry.protocol.storeclock import store_time
from registry.protocol.verify import verify_directory

#: duration units -> seconds (``--older-than``)
DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def _age(store: Store, key: str, now: float) -> float:
    files = store.walk_files(key)
    keys = [join(key, f) for f in files] if files else [key]
    newest = 0.0
    for k in keys:
        try:
            mtime = store.info(k).mtime
        except FileNotFoundError:
            continue
        newest = max(newest, mtime or 0.0)
    return now - newest


def _warn(message: str) -> None:
    warnings.warn(message, RuntimeWarning, stacklevel=3)


def _folders(store: Store) -> list[str]:
    out = [join(MODELS, m) for m in store.subdirs_confirmed(MODELS)]
    out += [run_root(r) for r in store.subdirs_confirmed(RUNS)]
    return out


def committed_here(store: Store, key: str) -> bool:
    """A committed directory whose manifest belongs at ``key``: a release's
    version (or a checkpoint's step directory) is the directory's own name.
    A staging directory holding a copied manifest is not committed here."""
    report = verify_directory(store, key)
    if report.manifest is None:
        return False
    name = key.rsplit("/", 1)[-1]
    meta = report.manifest.meta
    if report.manifest.kind == "release":
        return bool(meta.get("version") == name)
    layout = LOONGSAGE if meta.get("layout") == "loongsage" else TINYLLM
    return layout.parse_dir(name) == meta.get("step")


def _writer_dir(key: str) -> bool:
    """Whether ``key`` lies where a writer claims its directory before writing:
    ``models/<m>/<v>/<file>``, ``runs/<r>/ckpt/<step>/<file>``, a LoongSage
    step's files (three folders deep or more)."""
    return key.count("/") >= 3


def _loongsage_candidate(name: str) -> bool:
    step = name.split(TMP_MARK, 1)[0].removesuffix(CLAIM_SUFFIX)
    return LOONGSAGE.parse_dir(step) is not None


#: seconds (the store's clock) after which a multipart upload that no claim
#: covers is aborted: writers claim before they upload, so such an upload is
#: a dead writer's; the margin covers a claim read while it was being renewed.
ORPHAN_UPLOAD_AGE = 60.0


def collect(store: Store, *, older_than: float, dry_run: bool = False,
            trees: tuple[str, ...] | list[str] = (), break_claims: bool = False,
            warn: Callable[[str], None] | None = None,
            orphan_after: float = ORPHAN_UPLOAD_AGE,
            purge_versions: bool = False, progress: Progress = NULL) -> list[str]:
    """Delete (or with ``dry_run`` only list) abandoned leftovers; returns the keys
    deleted (or that would be).

    A claim (``*.claim``) says who owns the directory beside it (the version
    directory on object stores, the staging directory on local disk): while
    it is live (renewed within its lease, its process alive on this host)
    neither is touched, whatever their age; once it is not, both go at once,
    whatever ``older_than`` says. A claim is removed by taking it over first
    (compare-and-swap on the claim itself), so a writer recovering the same
    directory and gc never both proceed. Leftovers without a claim go by age.

    Args:
        older_than: seconds; younger unclaimed leftovers may belong to a live writer.
        trees: LoongSage ``checkpoint_path`` keys to scan as well.
        break_claims: remove claims even while live (the user knows their
            writers are gone).
        warn: told what could not be looked at (a server without
            ListMultipartUploads), or why claims were left alone, one
            message each (default for the clock: a RuntimeWarning).
        progress: told each folder as it is scanned (unit ``folders``), then
            each leftover as it is looked at and removed (unit ``leftovers``).

    A writer's multipart uploads belong to its claim: they lie under the
    claimed directory. Once the claim is not live they are aborted at once,
    whatever their age (issue 34 item 4); an upload inside a model or run
    directory that no claim covers is a dead writer's: aborted once its own
    age passes ``orphan_after`` seconds (issue 47; default a minute), not
    ``older_than``; other uploads go by ``older_than``. Ages are measured on
    the server's clock.

    On a versioned or object-locked bucket, ``purge_versions`` also deletes
    every noncurrent version and delete marker under the store (what was
    deleted or replaced is otherwise still stored and readable); without it,
    ``warn`` says so (:func:`versions`, issue 47).

    Every age is the store's time (a probe object, :mod:`registry.protocol.storeclock`)
    minus the store's stamps: no decision compares this host's clock with a
    remote one (issue 31 item 1). When this host's clock is further from the
    store's than the tolerance, no claim is taken over or removed (nor what
    it guards, nor its uploads), even with ``break_claims``: the difference
    is reported through ``warn``; unclaimed leftovers still go by their
    store-clock age.

    Raises:
        StorageError: the store failed (the clock probe included).
    """
    # Listed first: a store that does not exist is an error, never created
    # by the clock probe (which writes an object).
    top = _folders(store)
    clock = store_time(store)
    now = clock.now
    hold = clock.skewed()
    if hold:
        (warn or _warn)(f"{store.url}: {clock.describe()}; claims are left alone until the "
                        "clocks agree (fix the host's time: NTP)")
        break_claims = False
    doomed: list[tuple[str, bool]] = []
    folders = [(f, False) for f in top]
    folders += [(t.strip("/"), True) for t in trees]
    progress.start("gc scan", files=len(folders), unit="folders")
    for folder, loong in folders:
        progress.file_done(folder, 0)
        try:
            entries = store.list_dir(folder)
        except UnsafeEntryError as e:  # a link where the folder should be: never followed
            store.skip(str(e))
            continue
        claims = {name[:-len(CLAIM_SUFFIX)]: name for name, is_dir in entries
                  if not is_dir and name.endswith(CLAIM_SUFFIX)}
        states = {base: read_state(store, join(folder, name), now=now)
                  for base, name in claims.items()}
        for name, is_dir in entries:
            key = join(folder, name)
            if name == REFS or name.endswith(".lock") or name in (LATEST, POLICY):
                continue
            if loong and not _loongsage_candidate(name):
                continue
            if not is_dir and not name.endswith(CLAIM_SUFFIX):
                continue
            base = name[:-len(CLAIM_SUFFIX)] if not is_dir else name
            seen = states.get(base)
            if seen is not None:
                if hold or (seen[0].live and not break_claims):
                    continue
                if not is_dir:
                    doomed.append((key, False))
                continue  # a claimed directory goes with its claim, below
            if is_dir and committed_here(store, key):
                continue
            if not is_dir or _age(store, key, now) >= older_than:
                doomed.append((key, is_dir))
    removed = _event_temps(store, now, older_than, dry_run)

    def claim_over(key: str) -> bool | None:
        """Whether the claim of the directory ``key`` lies in is live (None:
        no claim there)."""
        parts = key.split("/")
        for i in range(len(parts) - 1, 0, -1):
            seen = read_state(store, "/".join(parts[:i]) + CLAIM_SUFFIX, now=now)
            if seen is not None:
                return hold or (seen[0].live and not break_claims)
        return None

    # Multipart uploads nobody will complete (a killed writer's) are billed
    # and invisible to listings: abort them, except under a live claim; a
    # dead writer's at once.
    removed += [f"{k} (multipart upload)" for k in store.abort_stale_uploads(
        older_than, dry_run=dry_run, keep=lambda k: claim_over(k) is True,
        doomed=lambda k: claim_over(k) is False, warn=warn,
        orphan=lambda k: _writer_dir(k) and claim_over(k) is None,
        orphan_after=orphan_after)]
    progress.start("gc remove", files=len(doomed), unit="leftovers")
    for key, is_dir in doomed:
        progress.file_done(key, 0)
        if not is_dir:  # a claim that is not live: take it over, then clear under it
            folder_key = key[:-len(CLAIM_SUFFIX)]
            if dry_run:
                removed += [k for k in (folder_key,) if store.walk_files(k)] + [key]
                continue
            claim = Claim(store, key)
            try:
                claim.take(force=break_claims)
            except ObjectExistsError:
                continue  # renewed or recovered meanwhile: a live writer has it
            try:
                if store.walk_files(folder_key) and not committed_here(store, folder_key):
                    delete_directory(store, folder_key)
                    removed.append(folder_key)
            finally:
                claim.release()
            removed.append(key)
            continue
        if committed_here(store, key):  # committed meanwhile: keep it
            continue
        if not dry_run:
            delete_directory(store, key)
        removed.append(key)
    removed += versions(store, "", purge=purge_versions, dry_run=dry_run, warn=warn or _warn)
    progress.finish()
    return removed


def versions(store: Store, prefix: str, *, purge: bool, dry_run: bool = False,
             warn: Callable[[str], None]) -> list[str]:
    """On a versioned or object-locked S3 bucket (registry.store.s3versions):
    with ``purge``, delete the noncurrent versions and delete markers under
    ``prefix`` (returned as ``"<key> (version <id>)"``; one Object Lock keeps
    is told to ``warn``); without, ``warn`` says what the bucket keeps. Nothing
    on other stores or plain buckets.

    Raises:
        StorageError: the server failed.
    """
    if not hasattr(store, "bucket"):
        return []
    modes = s3versions.bucket_modes(store)
    note = s3versions.describe(modes)
    if note is None:
        return []
    if not purge:
        warn(f"{store.url}: {note}")
        return []
    removed, kept = s3versions.purge_noncurrent(store, prefix, dry_run=dry_run)
    for k in kept:
        warn(f"{store.url}: kept {k}")
    return removed


def _event_temps(store: Store, now: float, older_than: float, dry_run: bool) -> list[str]:
    """Delete (or list) the event log's temporary files (``events/.tmp-<id>``,
    registry.events.log) older than ``older_than``: a killed append's
    leftovers, never an event. Links are skipped and named, never followed."""
    try:
        entries = store.list_dir(EVENTS)
    except UnsafeEntryError as e:  # a link where the folder should be
        store.skip(str(e))
        return []
    removed = []
    for name, is_dir in entries:
        key = join(EVENTS, name)
        if is_dir or not name.startswith(EVENTS_TMP_PREFIX):
            continue
        try:
            if _age(store, key, now) < older_than:
                continue
            if not dry_run:
                store.delete(key)
        except UnsafeEntryError as e:  # became a link since the listing
            store.skip(str(e))
            continue
        removed.append(key)
    return removed


def parse_duration(text: str, *, what: str = "duration") -> float:
    """``"90s"``, ``"15m"``, ``"2h"``, ``"7d"``, ``"2w"`` -> seconds. The unit is
    required (docs/decisions.md, "Durations need a unit"): a bare ``"5"`` could
    mean seconds or ``find -mtime``'s days. ``what`` names the option in errors.

    Raises:
        UsageError: not a duration; a number without a unit; not finite; negative.
    """
    t = text.strip().lower()
    try:
        if t and t[-1] in DURATION_UNITS:
            value = float(t[:-1]) * DURATION_UNITS[t[-1]]
        else:
            value = float(t)
    except ValueError:
        raise UsageError(f"{what} {text!r}: expected e.g. 90s, 15m, 2h, 7d, 2w") from None
    if not math.isfinite(value):
        raise UsageError(f"{what} {text!r}: expected a finite number, e.g. 90s, 15m, 2h, 7d")
    if value < 0:
        raise UsageError(f"{what} {text!r}: negative")
    if t[-1] not in DURATION_UNITS:
        raise UsageError(f"{what} {text!r}: give a unit (s, m, h, d, w), e.g. {t}s or {t}d")
    return value
