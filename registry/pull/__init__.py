"""Pull to serving hosts: verified, atomic, deduplicated, parallel (DESIGN section 7).

Needs only read access to the store, never the index.


Rooms it may import (tests/test_house.py keeps this list): errors, host, rules, obs, store, protocol, formats, gating, lifecycle, trust.
"""

from __future__ import annotations

import os

import shutil
import sys
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from registry.errors import InsufficientSpaceError, IntegrityError, UsageError
from registry.protocol.manifest import FileEntry
from registry.rules.names import model_key
from registry.obs.metrics import counting_store_bytes
from registry.obs.tracing import in_context, traced
from registry.pull.cache import Cache
from registry.pull import s3fetch
from registry.pull.download import fetch
from registry.pull.offline import remember
from registry.pull.opened import open_release, resolve_for_pull
from registry.pull.materialize import BlobChangedError, check_target, materialize
from registry.pull.records import gives_up_leases, record_pull, take_lease
from registry.store import Store
from registry.protocol.verify import default_workers

if TYPE_CHECKING:
    from registry.gating.gates import GateResult
    from registry.trust import Trust
    from registry.trust.marks import Marks

#: headroom kept free on the cache's filesystem, bytes.
FREE_MARGIN = 64 * 1024 * 1024
_MARGIN_MIB = FREE_MARGIN // (1024 * 1024)


@dataclass(frozen=True, slots=True)
class PullResult:
    """A pulled release: where it is and what it cost.

    Attributes:
        path: the materialized model directory.
        files: files in the release; ``downloaded``: how many were fetched
            (the rest were cache hits).
        bytes: total bytes of the release; ``transferred``: bytes downloaded.
        seconds: wall time of the pull.
        placed: False when the target already held this release.
        rehashed: True when every file was hashed again in this pull
            (``verify=True``), even those the cache or the target already
            held. Either way every file placed matches the manifest: a
            download or copy is hashed as it is read, a cache hit is checked
            by the stat stamp recorded when it was hashed.
        signer: fingerprint of the trusted key that signed the release (or
            of the signing certificate), when the pull was given trusted keys
            or CAs (else None); ``signed_by``: the whole check
            (``registry.trust.model_sig.SignatureCheck.to_dict``: kind, identity, CA).
    """

    model_id: str
    version: str
    manifest_sha256: str
    path: str
    files: int
    downloaded: int
    bytes: int
    transferred: int
    seconds: float
    placed: bool
    rehashed: bool
    signer: str | None = None
    signed_by: dict[str, Any] | None = None
    #: the gates it fails now (evaluated only when the pull was asked: ``gates``)
    failing: tuple[GateResult, ...] = ()
    #: what protects the release's records from a store writer, in words
    #: (:attr:`registry.trust.release.OpenedRelease.freshness`)
    freshness: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__  # type: ignore[attr-defined]
                if k != "failing"}


def _check_space(cache: Cache, target: Path, need_blobs: int, total: int) -> None:
    """The cache's filesystem must take the missing blobs, and the target's the
    model directory (placed as copies; a reflink would need less, but whether
    the filesystem clones is only known once it does), plus FREE_MARGIN each."""
    probe = target.parent if not target.exists() else target
    while not probe.exists():
        probe = probe.parent
    same = probe.stat().st_dev == cache.root.stat().st_dev
    free = shutil.disk_usage(cache.root).free
    need = need_blobs + (total if same else 0) + FREE_MARGIN
    if free < need:
        raise InsufficientSpaceError(
            f"{cache.root}: {free} bytes free, the pull needs {need} bytes ({need - FREE_MARGIN} "
            f"to download and place + a {_MARGIN_MIB} MiB safety margin kept free)",
            key=str(cache.root), needed=need, available=free)
    if not same:
        free_t = shutil.disk_usage(probe).free
        if free_t < total + FREE_MARGIN:
            raise InsufficientSpaceError(
                f"{probe}: {free_t} bytes free, the model directory needs "
                f"{total + FREE_MARGIN} bytes ({total} of files + a {_MARGIN_MIB} MiB safety "
                "margin kept free)", key=str(probe), needed=total + FREE_MARGIN, available=free_t)


#: ``$REGISTRY_PULL_BLOBS``: ``auto`` (the default), ``always`` or ``never``.
BLOBS_ENV = "REGISTRY_PULL_BLOBS"


def blob_mode(store: Store) -> bool:
    """Whether a pull from ``store`` keeps cache blobs when not told: by
    ``$REGISTRY_PULL_BLOBS`` (``always``, ``never``), else (``auto``) only for
    a store that is not on this host's filesystem. A local store already holds
    verified, immutable copies of every file: a blob beside it would be a
    second write of every byte and twice the disk for nothing a later pull
    could not get from the store itself (the Hugging Face cache made the same
    call for ``local_dir``; docs/decisions.md).

    Raises:
        UsageError: ``$REGISTRY_PULL_BLOBS`` holds another value.
    """
    mode = os.environ.get(BLOBS_ENV, "auto").strip().lower() or "auto"
    if mode not in ("auto", "always", "never"):
        raise UsageError(f"{BLOBS_ENV}={os.environ[BLOBS_ENV]!r}: expected auto, always "
                         "or never")
    if mode == "auto":
        return store.local_path("") is None
    return mode == "always"


#: ``$REGISTRY_PULL_DIGEST``: ``auto`` (the default) or ``sha256``.
DIGEST_ENV = "REGISTRY_PULL_DIGEST"


def digest_mode() -> str:
    """``$REGISTRY_PULL_DIGEST``: ``auto`` (the default) lets a pull from a
    local store check a file's BLAKE3 where its manifest entry has one
    (registry.protocol.fastdigest); ``sha256`` makes every pull check the sha256
    (by pieces on every core where the entry has them). Signed pulls
    always check the sha256, which is what the signature covers.

    Raises:
        UsageError: the variable holds another value.
    """
    mode = os.environ.get(DIGEST_ENV, "auto").strip().lower() or "auto"
    if mode not in ("auto", "sha256"):
        raise UsageError(f"{DIGEST_ENV}={os.environ[DIGEST_ENV]!r}: expected auto or sha256")
    return mode


def _refuse_overlap(target: Path, cache: Cache, store: Store, own: Path) -> None:
    """A target that is, holds or lies inside the cache or a local store would
    be destroyed by ``force``, or corrupt them: refused. Inside the cache only
    ``own`` is allowed (``<cache>/models/<model_id>/<version>`` of this
    release): ``cache prune`` removes what it finds under ``models/`` as its
    own, so a user's directory there (or another version's path) would be
    lost with it."""
    roots = [(cache.root.resolve(), "the cache", own.resolve())]
    local = store.local_path("")
    if local is not None:
        roots.append((Path(local).resolve(), "the store", None))
    for root, what, allowed in roots:
        inside = root == target or root in target.parents
        if allowed is not None and target == allowed:
            inside = False  # the cache's own models/<model_id>/<version>
        if inside or target in root.parents:
            raise UsageError(f"{target}: is, holds or lies inside {what} ({root}); "
                             "choose another --to")


def _missing(cache: Cache, entries: Iterable[FileEntry]) -> dict[str, FileEntry]:
    """The distinct blobs of ``entries`` the cache lacks, by sha256."""
    missing: dict[str, FileEntry] = {}
    for e in entries:
        if not cache.has(e.sha256, e.size):
            missing.setdefault(e.sha256, e)
    return missing


def _fetch_all(store: Store, prefix: str, missing: dict[str, FileEntry], cache: Cache, *,
               workers: int, progress: Callable[[int], None], range_threshold: int | None,
               fsync: bool, dests: dict[str, Path] | None = None,
               fast_digest: bool = False,
               then: Callable[[FileEntry], None] | None = None) -> int:
    """Download ``missing`` into the cache (or, by digest, to ``dests``),
    largest first; returns bytes received. ``fast_digest``: see
    registry.pull.download.fetch. ``then``: called with each entry on its
    file's thread once it is in the cache (pull places it from there while
    the other files download)."""
    if not missing:
        return 0
    transferred = 0

    def one(e: FileEntry, **kw: Any) -> int:
        got = 0 if then is not None and cache.has(e.sha256, e.size) else \
            fetch(store, prefix, e, cache, **kw)
        if then is not None:
            then(e)
        return got

    # an S3 pull's pieces are each one GET on these threads (registry.pull.s3fetch):
    # twice as many in flight as files measured faster (issue 43 item 9)
    range_threads = workers * (s3fetch.RANGE_FACTOR if s3fetch.reader_for(store) else 1)
    with ThreadPoolExecutor(range_threads, thread_name_prefix="pull-range") as ranges, \
            ThreadPoolExecutor(workers, thread_name_prefix="pull-file") as files, \
            ThreadPoolExecutor(default_workers(os.cpu_count() or 1),
                               thread_name_prefix="pull-pieces") as checks:
        futures = [files.submit(in_context(one), e, ranged_pool=ranges,
                                inflight=workers, progress=progress,
                                range_threshold=range_threshold, fsync=fsync,
                                verify_pool=checks, fast_digest=fast_digest,
                                dest=dests.get(e.sha256) if dests is not None else None)
                   for e in sorted(missing.values(), key=lambda e: -e.size)]
        errors = []
        for fut in futures:
            try:
                transferred += fut.result()
            except IntegrityError as err:
                errors.append(err)
        if errors:
            raise errors[0]
    return transferred


@gives_up_leases
@traced("registry.pull")
def pull(store: Store, model_id: str, name: str, *, to: str | Path | None = None,
         cache: str | Path | None = None, workers: int = 8, verify: bool = False,
         force: bool = False, progress: Callable[[int], None] | None = None,
         on_start: Callable[[int], None] | None = None,
         on_files: Callable[[int], None] | None = None,
         range_threshold: int | None = None, fsync: bool = True,
         trust: Trust | None = None, blobs: bool | None = None,
         ref: str | None = None, allow_yanked: bool = False, gates: bool = False,
         require_passing: bool = False, marks: Marks | None = None) -> PullResult:
    """Pull release ``model_id@name`` (a version or an alias) to a model directory.

    Args:
        to: where to place the model directory; default
            ``<cache>/models/<model_id>/<version>``.
        cache: the cache directory (default ``$REGISTRY_CACHE``).
        workers: parallel downloads (files, and byte ranges of large files).
        verify: re-hash every materialized file afterwards.
        force: replace a target directory that holds other content.
        progress: called with each chunk's byte count as it lands.
        on_start: called once with the number of bytes to download.
        on_files: called once, just before ``on_start``, with the number of
            files to download (registry.cli.progress shows both).
        range_threshold: files larger than this (bytes, default 64 MiB) may be
            split into parallel byte ranges, when their stream's measured rate
            and time to first byte say it pays (see registry.pull.download);
            every file starts as one streaming GET.
        fsync: fsync every downloaded blob before it enters the cache, so a
            pulled directory survives a power loss. False is for disks that
            do not outlive the host (a pod's emptyDir): a killed process
            still leaves nothing partial, but a power loss may.
        trust: the public keys and CA certificates this host trusts
            (``registry.trust.load_trust``): the release must carry a
            ``model.sig`` made by one of the keys, or with a certificate whose
            chain is valid now up to one of the CAs (none of them revoked),
            naming ``model_id@version`` and covering exactly the manifest's
            files and digests. What the bundle claims is checked
            before any weight is downloaded; its cryptographic verification
            (the library's) runs during the download and must pass before
            anything is placed. The download refuses any byte that does not
            hash to the manifest's digests, so nothing is hashed twice.
        blobs: keep a verified blob of every downloaded file in the cache
            (later pulls of other versions share it) and copy it into the
            target (each file as soon as its blob is verified, while the
            others download). None (the default): :func:`blob_mode` decides (True for
            object stores, False for a local store). False (``--no-blobs``, the Hugging Face
            ``local_dir`` way) downloads files the cache lacks straight into
            the staging directory: one write per byte instead of two, and no
            blob for a later pull to share. Files already cached are copied
            from their blobs either way; never a hardlink.
        ref: the name the user asked for (an alias the caller resolved to
            ``name`` already), remembered for ``--offline`` pulls
            (registry.pull.offline) beside ``name`` itself.
        allow_yanked: pull a yanked release anyway (issue 32: a plain pull
            refuses one, :mod:`registry.lifecycle.guard`).
        gates: evaluate the release's gates now (``PullResult.failing``);
            ``require_passing``: refuse it (GateFailedError, nothing read of
            its files) when it fails one.
        marks: this host's high-water marks of the store
            (:mod:`registry.trust.marks`); default: those in the cache folder.
            Everything from the alias to the signature is decided by
            :func:`registry.trust.release.open_release`.

    Returns:
        A PullResult.

    Raises:
        NotCommittedError, ManifestError: the release is not committed or its
            manifest is invalid (including unsafe paths).
        ReleaseDeletedError: the release was deleted (its tombstone).
        ReleaseYankedError: the release is yanked and not ``allow_yanked``;
            nothing is read of it.
        GateFailedError: ``require_passing`` and it fails a gate now.
        RollbackError: a yank record, tombstone or alias went back below
            what this host saw before (a SignatureError).
        IntegrityError: a stored file's size or sha256 differs from the
            manifest; nothing is placed under a final name. A cache blob found
            changed when placed is dropped and downloaded again, once
            (BlobChangedError if it is still wrong).
        InsufficientSpaceError: not enough free disk, checked before the
            first byte.
        CommitConflictError: the target holds other content (files of another
            release, or files the release does not list), or this release
            with a file changed since it was pulled, and not ``force``.
        SignatureError: ``trust`` given and ``name`` is an alias whose current
            move is unsigned, signed by a key ``trust`` lacks (or the model's
            policy does not list for it), or signed for another manifest
            (registry.trust.alias_sign); or ``trust`` given and the signature is missing,
            malformed, made by an untrusted or revoked key (or a certificate
            of another CA, expired, not yet valid, revoked), bound to another
            release, or not covering exactly the files; nothing is placed.
        UsageError: an empty ``to``, ``workers`` < 1, a negative
            ``range_threshold``, or a target that is, holds or lies inside the
            cache or a local store.
        StorageError: the cache or the target's parent cannot be created.

    Notes:
        Which digest is checked: a file's ``blake3`` (registry.protocol.fastdigest)
        where its entry has one, the store is local, no ``trust`` is given
        and ``$REGISTRY_PULL_DIGEST`` is not ``sha256``; else its sha256 (by
        pieces where the entry has them).
        The model directory holds reflinks or copies of the cache's blobs,
        never hardlinks: writing to it changes neither the cache nor another
        pulled directory, and a re-pull re-hashes every file whose stat stamp
        changed since it was placed (registry.pull.materialize).
        Concurrent pulls of one release into one cache and target all succeed:
        blobs and the directory are placed by atomic renames of unique temp
        names. A killed pull leaves only temp names, removed by the next pull.
        From before it looks at the cache until its record is written, a pull
        holds a lease there (registry.pull.records): ``registry cache prune``
        and ``cache verify`` leave its release and blobs alone.
    """
    t0 = time.perf_counter()
    if to is not None and not str(to).strip():
        raise UsageError(f"--to {str(to)!r}: must be a non-empty path")
    if workers < 1:
        raise UsageError(f"--workers {workers}: must be at least 1")
    if range_threshold is not None and range_threshold < 0:
        raise UsageError(f"--range-threshold-mib: {range_threshold} bytes: must not be "
                         "negative (0: any file may be split)")
    blobs = blob_mode(store) if blobs is None else blobs
    if marks is None:
        from registry.trust.marks import Marks as _Marks

        marks = _Marks.for_store(store.url, cache)
    opened = open_release(store, model_id, name, trust=trust, allow_yanked=allow_yanked,
                          gates=gates, require_passing=require_passing, marks=marks)
    version, prefix, manifest = opened.version, opened.prefix, opened.manifest
    signature = opened.signature
    c = Cache(cache)
    c.recheck = trust is not None  # a signed pull re-hashes every blob it did not download
    target = Path(to).expanduser().resolve() if to is not None else (
        c.models / model_key(model_id) / version)
    _refuse_overlap(target, c, store, c.models / model_key(model_id) / version)
    take_lease(c, manifest)  # cache prune leaves these blobs alone until pull returns
    c.clean_stale()
    on_progress = counting_store_bytes(progress)
    fast = trust is None and digest_mode() == "auto"
    holds, changed = check_target(target, manifest, c, need_sha256=not fast)
    wanted = [] if holds and not changed else list(manifest.files)
    missing = _missing(c, wanted)
    need = sum(e.size for e in missing.values())
    _check_space(c, target, need if blobs else 0,
                 0 if holds and not changed else manifest.total_size)
    if on_files:
        on_files(len(missing))
    if on_start:
        on_start(need)
    workers = max(1, workers)
    transferred = 0
    downloaded = len(missing)
    if signature is not None and (not blobs or not missing):
        signature.result()  # before the first byte lands in the staging directory

    def download(pairs: list[tuple[FileEntry, Path]]) -> None:
        nonlocal transferred
        if blobs:
            # Each file's blob is downloaded and verified, then placed in the
            # staging directory from it (reflink or copy, while its bytes are
            # still in the page cache) on the same thread, while the other
            # files download (issue 43: placing only after every download
            # left the disk idle during the downloads and the network during
            # the copies). The signature must pass before the first is placed.
            paths = {e.sha256: p for e, p in pairs}

            def place(e: FileEntry) -> None:
                if signature is not None:
                    signature.result()
                # looked up when called, as materialize's own calls are
                sys.modules[materialize.__module__].place_file(c, e, paths[e.sha256],
                                                               fsync=fsync)

            transferred += _fetch_all(store, prefix, {e.sha256: e for e, _ in pairs}, c,
                                      workers=workers, progress=on_progress,
                                      range_threshold=range_threshold, fsync=fsync,
                                      fast_digest=fast, then=place)
            return
        transferred += _fetch_all(store, prefix, {e.sha256: e for e, _ in pairs}, c,
                                  workers=workers, progress=on_progress,
                                  range_threshold=range_threshold, fsync=fsync,
                                  dests={e.sha256: p for e, p in pairs}, fast_digest=fast)

    direct = frozenset(missing)
    # files a one-write pull checks by BLAKE3 (registry.protocol.fastdigest; conservative:
    # one that falls back to streaming is checked by sha256 but still listed)
    b3_only = tuple(e.path for e in manifest.files if fast and not blobs and e.sha256 in direct
                    and e.blake3 is not None and store.local_path("") is not None)
    for attempt in (1, 2):
        try:
            placed = materialize(manifest, c, target, force=force, verify=verify, fsync=fsync,
                                 download=download, direct=direct, blake3_only=b3_only,
                                 need_sha256=not fast)
            break
        except BlobChangedError as err:
            # A blob changed after it was verified (someone wrote to the cache):
            # drop it and download it again, once.
            c.drop(err.sha256)
            if attempt == 2:
                raise
            again = _missing(c, [e for e in manifest.files if e.sha256 not in direct])
            transferred += _fetch_all(store, prefix, again, c, workers=workers,
                                      progress=on_progress, range_threshold=range_threshold,
                                      fsync=fsync, fast_digest=fast)
            downloaded += len(again)
        except IntegrityError as err:
            # --verify found a bad file: drop its blob, so the next pull
            # downloads it again.
            for e in manifest.files:
                if e.path == err.path:
                    c.drop(e.sha256)
            raise
    check = signature.result() if signature is not None else None
    signer = check.fingerprint if check is not None else None
    record_pull(c, manifest, target)
    remember(c, model_id, (ref or name or "main",), version, manifest)
    return PullResult(model_id, version, manifest.digest, str(target), len(manifest.files),
                      downloaded, manifest.total_size, transferred,
                      time.perf_counter() - t0, placed, verify, signer,
                      check.to_dict() if check is not None else None, tuple(opened.failed),
                      opened.freshness)


__all__ = ["BLOBS_ENV", "DIGEST_ENV", "PullResult", "blob_mode", "digest_mode", "pull",
           "resolve_for_pull"]
