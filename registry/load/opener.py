"""``open_weights``: from a ref to a :class:`~registry.load.reader.WeightsReader`.

One trust path: a release is admitted by
:func:`registry.pull.opened.open_release`, exactly as ``registry pull`` admits
it (signed alias moves, deletion, yank, gates, the signature's claims and its
cryptographic check, which here must pass before the first byte of a weights
file is read). A checkpoint step is a committed step directory (its
``MANIFEST.json``); checkpoints are not signed.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from registry.refs.aliases import parse_ref
from registry.errors import DocumentError, InvalidNameError, UsageError
from registry.load.layout import plan_weights
from registry.load.pieces import PieceReader
from registry.load.reader import WINDOW_BYTES, WeightFile, WeightsReader
from registry.load.sources import BlobSource, StoreSource
from registry.protocol.manifest import Manifest
from registry.obs.tracing import traced
from registry.store import Store, join

if TYPE_CHECKING:
    from registry.pull.cache import Cache
    from registry.trust import Trust


def _workers(store: Store, workers: int | None) -> int:
    if workers is not None:
        return workers
    if store.local_path("") is not None:
        return 8  # direct reads wait on the disk, not the CPU: keep its queue full
    return 16  # object stores: latency-bound, many ranged GETs in flight


def _blame_bytes(store: Store, prefix: str, manifest: Manifest) -> None:
    """The weights' plan was refused (a header or index that breaks a rule):
    when the bytes it was made from are not the released ones, say that
    instead, as a pull would. Checks the first piece (the header's) of every
    ``.safetensors`` file and the whole of every ``.json`` file.

    Raises:
        PieceMismatchError, IntegrityError: such bytes fail their digests.
    """
    from registry.load.pieces import covering

    reader = PieceReader(StoreSource(store))
    for e in manifest.files:
        if e.path.endswith((".safetensors", ".json")) and e.size:
            whole = covering(e, 0, e.size)
            for k in whole if e.path.endswith(".json") else whole[:1]:
                reader.read(join(prefix, e.path), e, k, [])


def _checkpoint(store: Store, ref: str) -> tuple[str, Manifest]:
    from registry.checkpoint.tree import CheckpointTree
    from registry.protocol.layout import run_root
    from registry.rules.names import check_name
    from registry.protocol.verify import read_manifest

    run_id, _, step = ref.partition("@")
    tree = CheckpointTree(store, run_root(check_name(run_id, "run_id")))
    if step in ("", "latest", "LATEST"):
        n = tree.latest()
        if n is None:
            raise InvalidNameError(f"{run_id}: no LATEST pointer (no committed checkpoint)",
                                   name=ref)
    else:
        digits = step.removeprefix("step-")
        if not digits.isdigit() or not digits.isascii():
            raise InvalidNameError(f"{ref!r}: expected RUN_ID@STEP (a number, step-NNNNNN "
                                   "or latest)", name=ref)
        n = int(digits)
    prefix = tree.prefix(n)
    return prefix, read_manifest(store, prefix)


@traced("registry.load.open")
def open_weights(ref: str, *, store: Store | str | None = None, trust: Trust | None = None,
                 trusted_keys: list[str] | None = None, device: str = "cpu",
                 framework: str = "pt", checkpoint: bool = False, allow_yanked: bool = False,
                 require_passing: bool = False, cache: str | os.PathLike[str] | None = None,
                 place: bool = False, offline: bool = False, workers: int | None = None,
                 window_bytes: int = WINDOW_BYTES, mapped: bool = True) -> WeightsReader:
    """Open the weights of ``model_id@version|alias`` (or, with ``checkpoint``,
    ``run_id@step``) for verified reading straight into memory.

    Args:
        store: a Store or store URL (None: ``$REGISTRY_STORE``, else ``./artifacts``).
        trust, trusted_keys: the host's trust (``registry.trust.load_trust``) or
            key files to build it from: the release must be signed by one, as
            for ``registry pull --trusted-key``.
        device: ``"cpu"`` or ``"cuda:N"`` (each verified tensor is copied from
            a pinned buffer; torch only).
        framework: ``"pt"`` (torch tensors) or ``"np"`` (numpy arrays; bf16
            through ml_dtypes).
        allow_yanked, require_passing: as ``registry pull``.
        cache: the pull cache to read blobs from (default: ``$REGISTRY_CACHE``
            or the default cache, when it exists; nothing is created).
        place: also land every weights file this reader reads whole into the
            pull cache as a verified blob (write-through), and record the ref
            for ``offline`` opens: the next start is warm without reading the
            store twice.
        offline: resolve from the pull cache's record of the last pull (or
            ``place``) and read only its blobs: the store is not touched.
        workers: pieces read at once (default 8 on a local store, 16 on an
            object store; each reading thread holds an 8 MiB bounce buffer).
        window_bytes: bytes of pieces in flight at once (default 1 GiB).
        mapped: on a local source (a local store, the pull cache) and the CPU,
            read each file through one descriptor opened once (a file renamed
            over in the store is not what later pieces come from), into
            tensors laid out at the file's page offsets: from the page cache
            when it holds the bytes, else with ``O_DIRECT`` straight into the
            tensors' pages (registry.load.direct). ``False``: tensors in
            ordinary memory, filled with ``preadv`` through the store's
            opener at every piece. Either way tensors are the process's own
            memory: no later write to the file changes one.

    Returns:
        A :class:`WeightsReader` (a context manager: close it).

    Raises:
        InvalidNameError, NotCommittedError, ManifestError: no such release or
            step, or its manifest is invalid.
        ReleaseDeletedError, ReleaseYankedError, GateFailedError,
            SignatureError: refused by the trust path (see
            :func:`registry.pull.opened.open_release`); nothing is read.
        DocumentError, SafetensorsError: the weights break the model
            directory's rules (named file and rule).
        UsageError: bad arguments.
    """
    from registry.store import open_store

    began = time.perf_counter()
    if trust is None and trusted_keys:
        from registry.trust import load_trust

        trust = load_trust(trusted_keys)
    if checkpoint and trust is not None:
        raise UsageError("checkpoints are not signed: trusted keys apply to releases only")
    c = _cache(cache, create=place or offline)
    if offline:
        if c is None:
            raise UsageError("offline: no pull cache here")
        from registry.pull.offline import CacheStore, recall

        model_id, name = _release_ref(ref)
        version, manifest = recall(c, model_id, name or "main")
        s: Store = CacheStore(c, model_id, version, manifest)
        allow_yanked = True  # as pull --offline: the record is this host's own
    else:
        s = store if isinstance(store, Store) else open_store(store)
    if checkpoint:
        prefix, manifest = _checkpoint(s, ref)
        model_id, version = ref.partition("@")[0], None
    else:
        from registry.pull.opened import open_release

        model_id, name = _release_ref(ref)
        from registry.trust.marks import Marks

        # this host's marks live in the cache it names, as pull's (else $REGISTRY_CACHE's)
        marks = Marks.for_store(s.url, cache) if cache is not None and not offline else "host"
        opened = open_release(s, model_id, name, trust=trust, allow_yanked=allow_yanked,
                              require_passing=require_passing, marks=marks)
        opened.signature_check()  # before the first byte of a weights file is read
        prefix, manifest, version = opened.prefix, opened.manifest, opened.version
    try:
        weights = plan_weights(s, prefix, manifest, where=s.url_of(prefix))
    except DocumentError:
        _blame_bytes(s, prefix, manifest)  # a tampered header is a digest failure, as in pull
        raise
    entries = {e.path: e for e in manifest.files}
    store_reader = PieceReader(StoreSource(s), mapped=mapped)
    files: dict[str, WeightFile] = {}
    placing = []
    for shard in weights.shards:
        entry = entries[shard.path]
        reader = store_reader
        if c is not None and c.has(entry.sha256, entry.size):
            reader = PieceReader(BlobSource(c.blob(entry.sha256)), mapped=mapped)
        f = WeightFile(entry, join(prefix, shard.path), shard.header, reader)
        if place and c is not None and reader is store_reader:
            from registry.load.place import BlobWriter

            w = BlobWriter(c, entry)
            f.written = w.written
            placing.append(w)
        files[shard.path] = f
    tensors = {name: (shard.path, info) for name, (shard, info) in weights.tensors.items()}
    metadata: dict[str, str] = {}
    for shard in weights.shards:
        metadata.update(shard.header.metadata)

    def on_close() -> None:
        for w in placing:
            w.close()
        if place and c is not None and version is not None and all(
                c.has(entries[p].sha256, entries[p].size) for p in files):
            from registry.pull.offline import remember

            remember(c, model_id, (ref.partition("@")[2] or "main",), version, manifest)

    reader = WeightsReader(files, tensors, framework=framework, device=device,
                           workers=_workers(s, workers), window_bytes=window_bytes,
                           ref=ref, metadata=metadata, on_close=on_close, mapped=mapped)
    reader.store, reader.prefix, reader.manifest = s, prefix, manifest
    reader.version = version
    reader.stats.resolve_seconds = time.perf_counter() - began
    return reader


def _release_ref(ref: str) -> tuple[str, str]:
    """``(model_id, name)``; ``name`` is "" for a bare model id (the default ref)."""
    model_id, name = parse_ref(ref)
    return model_id, name or ""


def _cache(path: str | os.PathLike[str] | None, *, create: bool) -> Cache | None:
    from registry.pull.cache import Cache, cache_dir

    root = cache_dir(path)
    if not create and not (Path(root) / "blobs" / "sha256").is_dir():
        return None
    if path is None and not create:
        from registry.errors import StorageError

        try:
            return Cache(root)
        except StorageError:
            return None  # the default cache is not this user's to use: read the store
    return Cache(root)


__all__ = ["open_weights"]
