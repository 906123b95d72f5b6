"""torch.distributed.checkpoint (DCP) over a registry Store: writers that hash
what they write, readers, and the collective helpers of a multi-rank commit.

Needs the ``torch`` extra (``pip install 'modeldir-registry[torch]'``); nothing in
the registry core imports this module (``import registry`` never loads torch).

Where DCP writes (docs/decisions.md, "dist_ckpt through DCP"):

* local disk: :class:`~torch.distributed.checkpoint.FileSystemWriter` into the
  step's staging directory (``train_step_<N>.tmp-<owner>/dist_ckpt``), each
  file written through the store's durable file (its measured write path:
  direct I/O where that is faster, so no page cache is filled, allocated and
  written back; fsynced at close, in place of DCP's ``sync_files``), renamed
  with the whole step on commit;
* object stores (S3, memory): each rank's DCP writes go to a private folder
  on local disk (:func:`local_staging`), then the rank uploads the files it
  wrote into the claimed step prefix through the Store, each a conditional
  create (:func:`upload_staged`); rank 0 uploads ``.metadata``. DCP's fsspec
  writer straight into S3 measured slower on moto (bench/dcp_bench.py
  ``--s3-mib``), writes ``.metadata`` as a temporary object it then renames
  (copy + delete on S3), and bypasses the conditional creates, so it is only
  kept for :func:`storage_writer` of stores without a local path.

Each rank's ``*.distcp`` files are hashed (sha256) while DCP writes them, by the
rank that writes them; :func:`gather_entries` brings every rank's entries to
rank 0, which hashes ``.metadata`` and writes MANIFEST.json.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import torch.distributed as dist
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

from registry.checkpoint.dcp_safe import SafeFileSystemReader, SafeFsspecReader

from registry.errors import CheckpointError
from registry.protocol.manifest import FileEntry
from registry.store import Store, join

METADATA = ".metadata"


class _HashingStream:
    """A write stream that hashes what passes through it on a helper thread,
    lagging behind the writes, so that sha256 overlaps the rest of the file's
    writes and its fsync instead of adding to them.

    Blocks of 1 MiB or more are hashed from the caller's memory, not copied:
    DCP writes them from the tensors' storage (torch.save's records), which
    lives until ``dcp.save`` returns, and :meth:`digest` (on closing the
    file, inside ``dcp.save``) waits for the hash. Smaller blocks (zip
    headers, pickles) are copied first, since their buffers are reused.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.size = 0
        self._h = hashlib.sha256()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dcp-hash")
        self._hashed: list[Future[None]] = []

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        block = view if view.nbytes >= 1 << 20 else bytes(view)
        # one thread: the blocks are hashed in order
        self._hashed.append(self._pool.submit(self._h.update, block))
        n = self.inner.write(view)
        self.size += view.nbytes
        return n if n is not None else view.nbytes

    def digest(self) -> str:
        self._pool.shutdown(wait=True)
        for done in self._hashed:
            done.result()  # raises a failed update
        return self._h.hexdigest()

    def tell(self) -> int:
        return int(self.inner.tell())

    def fileno(self) -> int:
        return int(self.inner.fileno())

    def flush(self) -> None:
        self.inner.flush()

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def close(self) -> None:
        self.inner.close()

    @property
    def closed(self) -> bool:
        return bool(self.inner.closed)


class _Counted:
    """A registry durable file (``LocalStore.open_write``: direct I/O where the
    store's measured write path chose it, fsynced at close) with the
    ``tell``/``fileno`` DCP asks of its streams."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw
        self.pos = 0

    def write(self, data: Any) -> int:
        n = memoryview(data).nbytes
        self.raw.write(data)
        self.pos += n
        return n

    def tell(self) -> int:
        return self.pos

    def fileno(self) -> int:
        return int(self.raw._f.fileno())

    def flush(self) -> None:
        pass  # the durable file flushes (and fsyncs) at close

    def close(self) -> None:
        self.raw.close()

    @property
    def closed(self) -> bool:
        return bool(self.raw._f.closed)


class _HashingFS:
    """Wraps a DCP FileSystem: every stream opened for writing is hashed, and
    ``records`` maps each written file's name to its (size, sha256). With
    ``durable`` (a local store), a file opened for writing is the store's
    own durable file instead of DCP's buffered one: written by the store's
    measured write path (direct I/O on disks where that is faster: no page
    cache to fill, allocate and write back) and fsynced when closed."""

    def __init__(self, inner: Any, durable: Any = None) -> None:
        self.inner = inner
        self.durable = durable
        self.records: dict[str, tuple[int, str]] = {}
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[Any]:
        if "w" not in mode:
            with self.inner.create_stream(path, mode) as stream:
                yield stream
            return
        if self.durable is not None:
            stream = _Counted(self.durable(os.fspath(path)))
            try:
                hashing = _HashingStream(stream)
                yield hashing
                digest = hashing.digest()
            finally:
                stream.close()  # flushes the direct buffers and fsyncs
        else:
            with self.inner.create_stream(path, mode) as stream:
                hashing = _HashingStream(stream)
                yield hashing
                digest = hashing.digest()
        with self._lock:
            self.records[os.path.basename(os.fspath(path))] = (hashing.size, digest)


def storage_writer(store: Store, key: str, *, thread_count: int = 1) -> Any:
    """A DCP StorageWriter into ``key`` of ``store`` whose ``fs.records`` holds
    the (size, sha256) of every file it wrote (see the module notes)."""
    local = store.local_path(key)
    writer: Any
    durable = None
    if local is not None:
        # The store's durable files fsync at close: DCP's own fsync (sync_files)
        # would come before the last direct buffer is written.
        writer = FileSystemWriter(local, sync_files=False, thread_count=thread_count,
                                  overwrite=False)
        durable = _durable_opener(store)
    else:
        writer = FsspecWriter(store.url_of(key), sync_files=False, thread_count=thread_count,
                              overwrite=False)
        writer.fs.fs = store.fs  # the Store's endpoint and credentials
        writer.path = store.path(key)
    writer.fs = _HashingFS(writer.fs, durable)
    return writer


def _durable_opener(store: Store) -> Any:
    """``path -> durable file`` of the local store ``store`` (its measured
    write path, fsync at close)."""
    from registry.store.local import _DurableFile
    from registry.store.writepath import write_path

    root = store.local_path("")
    assert root is not None

    def open_durable(path: str) -> Any:
        return _DurableFile(path, "wb", write_path=lambda: write_path(str(root)))
    return open_durable


def storage_reader(store: Store, key: str) -> Any:
    """A DCP StorageReader of the DCP directory ``key`` of ``store``, whose
    ``.metadata`` goes through the restricted unpickler
    (:mod:`registry.checkpoint.dcp_safe`; load with
    :func:`~registry.checkpoint.dcp_safe.SafeLoadPlanner` too)."""
    local = store.local_path(key)
    reader: Any
    if local is not None:
        reader = SafeFileSystemReader(local)
    else:
        reader = SafeFsspecReader(store.url_of(key))
        reader.fs.fs = store.fs
        reader.path = store.path(key)
    reader.where = store.url_of(key)
    return reader


def written_entries(writer: Any, under: str) -> list[FileEntry]:
    """Manifest entries (path ``<under>/<name>``) of the ``*.distcp`` files
    ``writer`` wrote on this rank (``.metadata`` is hashed by rank 0 later:
    DCP writes it as a temporary file and renames it)."""
    fs: _HashingFS = writer.fs
    return [FileEntry(f"{under}/{name}", size, sha) for name, (size, sha)
            in sorted(fs.records.items()) if name.endswith(".distcp")]


def hash_object(store: Store, key: str, rel: str) -> FileEntry:
    """The manifest entry of ``key`` (path ``rel``), read and hashed."""
    h = hashlib.sha256()
    n = 0
    for block in store.iter_read(key):
        h.update(block)
        n += len(block)
    return FileEntry(rel, n, h.hexdigest())


def rank_of(group: Any = None) -> int:
    """This process's rank in ``group`` (0 without an initialized process group)."""
    return dist.get_rank(group) if dist.is_initialized() else 0


def world_of(group: Any = None) -> int:
    """The size of ``group`` (1 without an initialized process group)."""
    return dist.get_world_size(group) if dist.is_initialized() else 1


def broadcast(obj: Any, group: Any = None) -> Any:
    """Rank 0's ``obj`` on every rank (a no-op without a process group)."""
    if not dist.is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=dist.get_global_rank(group, 0) if group else 0,
                               group=group)
    return box[0]


def gather_entries(entries: list[FileEntry] | str, group: Any = None) -> list[FileEntry] | None:
    """Every rank's entries on rank 0 (None on the others). A rank that failed
    passes its error message instead; rank 0 then raises CheckpointError
    naming it (so no rank waits for a peer that gave up).

    Raises:
        CheckpointError: on rank 0, when a rank passed an error.
    """
    if isinstance(entries, str):
        rows: Any = entries
    else:
        rows = [(e.path, e.size, e.sha256) for e in entries]
    if not dist.is_initialized():
        parts: list[Any] | None = [rows]
    else:
        parts = [None] * world_of(group) if rank_of(group) == 0 else None
        dist.gather_object(rows, parts, dst=dist.get_global_rank(group, 0) if group else 0,
                           group=group)
    if parts is None:
        return None
    for r, part in enumerate(parts):
        if isinstance(part, str):
            raise CheckpointError(f"rank {r} could not write its shards: {part}")
    return [FileEntry(p, s, h) for part in parts for (p, s, h) in part]


def metadata_key(prefix: str, under: str) -> str:
    """Key of DCP's ``.metadata`` in the DCP directory ``under`` of ``prefix``."""
    return join(prefix, under, METADATA)


def upload_staged(store: Store, local_dir: str, key: str, names: list[str]) -> None:
    """Copy the files ``names`` of the local DCP directory ``local_dir`` to
    ``key`` in ``store``, each a conditional create (the object-store commit
    protocol: never over a file another writer put there), streamed."""
    for name in names:
        path = os.path.join(local_dir, name)
        with open(path, "rb") as src, \
                store.open_write(join(key, name), exclusive=True,
                                 size=os.fstat(src.fileno()).st_size) as dst:
            shutil.copyfileobj(src, dst, 8 << 20)


@contextmanager
def local_staging() -> Iterator[tuple[Store, str]]:
    """Where this rank's DCP writes land before the commit: for object stores a
    private temporary folder on local disk (``$REGISTRY_DCP_STAGING`` or the
    system's temp dir), removed afterwards; yields (store, key) of the DCP
    directory's parent there."""
    from registry.store import open_store

    tmp = tempfile.mkdtemp(prefix="dcp-stage-", dir=os.environ.get("REGISTRY_DCP_STAGING"))
    try:
        yield open_store(tmp), ""
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
