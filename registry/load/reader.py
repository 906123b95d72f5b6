"""The weights reader: a release's (or a checkpoint step's) tensors, straight
from the store into memory, every byte verified before it is handed out
(DESIGN section 9; issue 43).

Shaped like safetensors' ``safe_open``: :meth:`WeightsReader.keys`,
:meth:`~WeightsReader.metadata`, :meth:`~WeightsReader.get_tensor`,
:meth:`~WeightsReader.get_slice`, plus iteration in the order bytes arrive and
:meth:`~WeightsReader.state_dict`. Open one with :func:`registry.load.open_weights`.

**What is verified, and when.** The manifest is the release's, admitted by
the same trust path as a pull (:func:`registry.pull.opened.open_release`:
alias, deletion, yank, gates when asked, signature checked before the first
byte of a file is read). Every file is read in its manifest pieces (64 MiB by
default; a file without piece states is one piece) by
:class:`registry.load.pieces.PieceReader`: a tensor is returned only once
every piece holding any of its bytes, and every piece holding its file's
header, has hashed to the manifest's state. A header that differs from the
one the plan was made from is refused. A bad piece raises
:class:`~registry.errors.PieceMismatchError` (file, piece, expected digest);
no tensor touching it is returned.

**Memory.** Every tensor is memory of its own, allocated at its final size
and filled in place; nothing handed out maps a file, so no later write to
the store (in place or by rename) changes a tensor. On a local source (a
local store, the pull cache) and the CPU, a tensor's memory is laid out at
the file's page offsets and each piece is read by :mod:`registry.load.direct`:
from the page cache when it holds the bytes (one copy), else with
``O_DIRECT`` straight into the tensor's pages (no copy); pages shared by two
tensors pass through a per-thread 8 MiB bounce buffer. On S3 the body is
received into the tensor (registry.store.s3direct); elsewhere one copy per
received block. At most ``window_bytes`` of pieces (default 1 GiB) are in
flight at once, plus one scratch buffer per thread for bytes no tensor asked
for. Nothing is written to disk, unless ``place`` asks for the pull cache to
be filled (see :func:`open_weights`).
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from registry.errors import IntegrityError, UsageError
from registry.load.dequant import dequantized
from registry.load.direct import MIN_ALIGNED
from registry.load.pieces import PieceReader, Target, covering
from registry.protocol.manifest import FileEntry
from registry.obs.tracing import in_context, traced_iter
from registry.formats.safetensors_format import DTYPES, SafetensorsHeader, TensorInfo
from registry.formats.safetensors_io import read_header

#: default bytes of pieces in flight at once (the bounded buffer pool).
WINDOW_BYTES = 1024 * 1024 * 1024
#: what a want holds once handed out (the reader keeps no reference to it)
_DONE: Any = None


@dataclass
class WeightFile:
    """One weights file: its manifest entry, store key, planned header, source."""

    entry: FileEntry
    key: str
    header: SafetensorsHeader
    reader: PieceReader
    verified_header: bool = False
    written: Callable[[int, list[Target]], None] | None = None


@dataclass
class LoadStats:
    """What a read cost: ``tensors`` returned, ``bytes`` read and verified,
    ``seconds`` from the first read to the last tensor, ``first_tensor_seconds``
    from the first read to the first tensor, ``resolve_seconds`` what
    ``open_weights`` took before it (admission, signature, plan)."""

    tensors: int = 0
    bytes: int = 0
    seconds: float = 0.0
    started: float = field(default_factory=time.perf_counter)
    first_tensor_seconds: float = 0.0
    resolve_seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        gbps = self.bytes / 1e9 / self.seconds if self.seconds > 0 else 0.0
        return {"tensors": self.tensors, "bytes": self.bytes,
                "seconds": round(self.seconds, 6), "gbps": round(gbps, 3),
                "resolve_seconds": round(self.resolve_seconds, 6),
                "first_tensor_seconds": round(self.first_tensor_seconds, 6)}


@dataclass
class _Want:
    """A span of a file someone asked for, and what to do once it verified."""

    name: str
    file: WeightFile
    start: int
    end: int
    dtype: str
    shape: tuple[int, ...]
    obj: Any = None
    view: memoryview | None = None
    whole: memoryview | None = None
    base: int = 0


class WeightsReader:
    """Verified tensors of one model directory (see the module docstring).

    Not thread-safe: use one reader per thread, or serialize calls.
    """

    def __init__(self, files: dict[str, WeightFile], tensors: dict[str, tuple[str, TensorInfo]],
                 *, framework: str = "pt", device: str = "cpu", workers: int = 8,
                 window_bytes: int = WINDOW_BYTES, ref: str = "",
                 metadata: dict[str, str] | None = None,
                 on_close: Callable[[], None] | None = None, mapped: bool = True) -> None:
        if framework not in ("pt", "np"):
            raise UsageError(f"framework {framework!r}: expected 'pt' (torch) or 'np' (numpy)")
        if framework == "np" and device != "cpu":
            raise UsageError(f"device {device!r}: numpy arrays live on the CPU; use "
                             "framework='pt' for another device")
        if workers < 1:
            raise UsageError(f"workers {workers}: must be at least 1")
        if window_bytes < 1:
            raise UsageError(f"window_bytes {window_bytes}: must be positive")
        self.files, self._tensors = files, tensors
        self.framework, self.device, self.workers = framework, device, workers
        self.window_bytes, self.ref = window_bytes, ref
        self._metadata = metadata if metadata is not None else {}
        self._on_close = on_close
        #: hand out tensors of local files as mappings (see open_weights)
        self.mapped = mapped
        self._pool: ThreadPoolExecutor | None = None
        if framework == "pt":
            import registry.load.torchio  # noqa: F401  (imported before the clock starts)
        self.stats = LoadStats()
        #: what the opener fills in: the store, the directory's prefix, its
        #: manifest and the version (None for a checkpoint step)
        self.store: Any = None
        self.prefix = ""
        self.manifest: Any = None
        self.version: str | None = None

    # -- safe_open's surface ---------------------------------------------------

    def keys(self) -> list[str]:
        """Tensor names, file by file in file order."""
        return list(self._tensors)

    def nbytes(self, name: str) -> int:
        """Bytes of tensor ``name``'s data in its file (KeyError: no such tensor)."""
        info = self._tensors[name][1]
        return info.end - info.begin

    def metadata(self) -> dict[str, str]:
        """The weights' ``__metadata__`` (of every shard, merged; verified before it
        is returned: the headers' pieces are read)."""
        self._verify_headers()
        return dict(self._metadata)

    def get_tensor(self, name: str) -> Any:
        """The tensor ``name``, read and verified (only the pieces holding it
        and its file's header).

        Raises:
            KeyError: no tensor of that name.
            PieceMismatchError, IntegrityError, StorageError: see the module docstring.
        """
        path, info = self._info(name)
        f = self.files[path]
        start = f.header.data_start
        want = _Want(name, f, start + info.begin, start + info.end, info.dtype, info.shape)
        for w in self._read([want]):
            return self._finish(w.obj)
        raise AssertionError("unreachable")

    def get_slice(self, name: str) -> TensorSlice:
        """A lazily read view of tensor ``name``: ``get_shape()``, ``get_dtype()``
        and ``[...]`` indexing that reads only the pieces under the rows asked for.

        Raises:
            KeyError: no tensor of that name.
        """
        path, info = self._info(name)
        return TensorSlice(self, path, info)

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        """``(name, tensor)`` pairs in arrival order: :meth:`tensors`."""
        return self.tensors()

    def __len__(self) -> int:
        return len(self._tensors)

    def __contains__(self, name: object) -> bool:
        return name in self._tensors

    def __getitem__(self, name: str) -> Any:
        """:meth:`get_tensor` (so ``dict(reader)`` works, one tensor at a time;
        :meth:`state_dict` reads them all at once, faster)."""
        return self.get_tensor(name)

    def tensors(self, names: list[str] | None = None) -> Iterator[tuple[str, Any]]:
        """Yield ``(name, tensor)`` for every tensor (or ``names``), in the order
        their pieces verify: sooner on a fast store, never before verification.

        Raises:
            KeyError: a name that is not a tensor.
            PieceMismatchError, IntegrityError, StorageError: a piece failed;
                the tensors already yielded were verified and touch none of it.
        """
        wanted = []
        for name in (names if names is not None else self.keys()):
            path, info = self._info(name)
            f = self.files[path]
            start = f.header.data_start
            wanted.append(_Want(name, f, start + info.begin, start + info.end, info.dtype,
                                info.shape))
        wanted.sort(key=lambda w: (w.file.key, w.start))
        for w in self._read(wanted):
            yield w.name, self._finish(w.obj)

    def state_dict(self, *, dequantize: bool = False) -> dict[str, Any]:
        """Every tensor, by name (file order). ``dequantize``: an int4 release's
        ``<name>.qweight`` / ``<name>.scales`` pairs become one F32 ``<name>``
        (registry.release.convert.dequantize_int4), for engines that load
        dense weights."""
        got = dict(self.tensors())
        out = {name: got[name] for name in self.keys()}
        return dequantized(out, self.metadata(), self.framework) if dequantize else out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        for f in self.files.values():
            closing = getattr(f.reader.source, "close", None)
            if closing is not None:
                closing()  # its open files (tensors handed out keep their mappings)
        if self._on_close is not None:
            self._on_close()
            self._on_close = None

    def __enter__(self) -> WeightsReader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- internals -------------------------------------------------------------

    def _info(self, name: str) -> tuple[str, TensorInfo]:
        try:
            return self._tensors[name]
        except KeyError:
            raise KeyError(f"{self.ref}: no tensor named {name!r}") from None

    def _alloc(self, dtype: str, shape: tuple[int, ...]) -> tuple[Any, memoryview | None]:
        if self.framework == "np":
            arr = np.empty(shape, dtype=DTYPES[dtype])
            flat = arr.reshape(-1).view(np.uint8)
            return arr, memoryview(flat) if flat.size else None
        import torch

        from registry.load.torchio import TORCH_DTYPES

        t = torch.empty(shape, dtype=TORCH_DTYPES[dtype],
                        pin_memory=self.device.startswith("cuda"))
        flat = t.reshape(-1).view(torch.uint8)
        return t, memoryview(flat.numpy()) if flat.numel() else None

    def _maps(self, f: WeightFile) -> bool:
        """Whether tensors of ``f`` are handed out as private mappings of its
        verified file (a local source, on the CPU, nothing placed)."""
        return self.mapped and f.reader.mapped and f.written is None and self.device == "cpu"

    def _aligned(self, w: _Want) -> tuple[Any, memoryview, memoryview, int]:
        """``(tensor, its bytes, the page-aligned memory around them, the file
        offset of that memory's first byte)`` for ``w``: private anonymous
        memory laid out at the file's page offsets (registry.load.direct), so
        a local read lands the tensor's whole pages there directly."""
        from registry.load.direct import aligned

        mem, off = aligned(w.start, w.end)
        n = w.end - w.start
        whole = memoryview(mem)
        if self.framework == "np":
            dt = np.dtype(DTYPES[w.dtype])
            t = np.frombuffer(mem, dtype=dt, count=n // dt.itemsize, offset=off).reshape(w.shape)
        else:
            import torch

            from registry.load.torchio import TORCH_DTYPES

            dtype = TORCH_DTYPES[w.dtype]
            count = n // torch.empty((), dtype=dtype).element_size()
            t = torch.frombuffer(mem, dtype=dtype, count=count, offset=off).reshape(w.shape)
        return t, whole[off:off + n], whole, w.start - off

    def _finish(self, obj: Any) -> Any:
        self.stats.tensors += 1
        self.stats.seconds = time.perf_counter() - self.stats.started
        if self.stats.tensors == 1:
            self.stats.first_tensor_seconds = self.stats.seconds
        if self.framework == "pt" and self.device != "cpu":
            return obj.to(self.device, non_blocking=True)
        return obj

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="load-piece")
        return self._pool

    def _verify_headers(self) -> None:
        todo = [f for f in self.files.values() if not f.verified_header]
        if todo:
            for _ in self._read([], headers=todo):
                pass

    @traced_iter("registry.load.read")
    def _read(self, wanted: list[_Want], headers: list[WeightFile] = (),
              aligned: bool = True) -> Iterator[_Want]:
        """Read the pieces under ``wanted`` (and the headers of their files, and
        of ``headers``), yielding each want once all its pieces verified.
        ``aligned``: tensors of a local file get page-aligned memory that
        reads land in directly (registry.load.direct)."""
        files = {id(w.file): w.file for w in wanted} | {id(f): f for f in headers}
        hbufs: dict[int, memoryview] = {}
        need: dict[tuple[int, int], list[_Want]] = {}
        left: dict[int, int] = {}
        header_left: dict[int, set[int]] = {}
        for fid, f in files.items():
            if not f.verified_header:
                hbufs[fid] = memoryview(bytearray(f.header.data_start))
                header_left[fid] = set(covering(f.entry, 0, f.header.data_start))
        order: list[tuple[int, int]] = []
        seen: set[tuple[int, int]] = set()

        def add(piece: tuple[int, int]) -> None:
            if piece not in seen:
                seen.add(piece)
                order.append(piece)

        ready: list[_Want] = []
        for i, w in enumerate(wanted):
            fid = id(w.file)
            ks = set(covering(w.file.entry, w.start, w.end)) | header_left.get(fid, set())
            left[i] = len(ks)
            for k in sorted(ks):
                need.setdefault((fid, k), []).append(w)
                add((fid, k))
            if not ks:
                ready.append(w)
        for fid, ks in header_left.items():
            for k in sorted(ks):
                add((fid, k))
        index = {id(w): i for i, w in enumerate(wanted)}
        for w in ready:
            w.obj, w.view = self._alloc(w.dtype, w.shape)
            yield w
            w.obj = w.view = _DONE

        pool = self._executor()
        if not self.stats.bytes and not self.stats.tensors:
            self.stats.started = time.perf_counter()  # the clock starts at the first read
        inflight: dict[Future[None], tuple[int, int, int, list[Target]]] = {}
        budget = 0
        pos = 0
        try:
            while pos < len(order) or inflight:
                while pos < len(order) and (not inflight or budget < self.window_bytes):
                    fid, k = order[pos]
                    pos += 1
                    f = files[fid]
                    targets = []
                    if fid in hbufs and k in header_left.get(fid, ()):
                        targets.append(Target(0, f.header.data_start, hbufs[fid]))
                    direct = aligned and self._maps(f)
                    for w in need.get((fid, k), []):
                        if w.obj is None and w.view is None:
                            if direct and w.end - w.start >= MIN_ALIGNED:
                                w.obj, w.view, w.whole, w.base = self._aligned(w)
                            else:
                                w.obj, w.view = self._alloc(w.dtype, w.shape)
                            if w.view is None:
                                w.view = memoryview(b"")
                        if len(w.view):
                            targets.append(Target(w.start, w.end, w.view, w.whole, w.base))
                    targets.sort(key=lambda t: t.start)
                    size = _piece_size(f.entry, k)
                    budget += size
                    inflight[pool.submit(in_context(f.reader.read), f.key, f.entry, k,
                                         targets)] = (fid, k, size, targets)
                done, _ = wait(inflight, return_when=FIRST_COMPLETED)
                done_now = [(fut, inflight.pop(fut)) for fut in done]
                for fut, (fid, k, size, targets) in done_now:
                    budget -= size
                    fut.result()
                    f = files[fid]
                    self.stats.bytes += size
                    if f.written is not None:
                        f.written(k, targets)  # before any tensor of the piece is handed out
                    hl = header_left.get(fid)
                    if hl is not None and k in hl:
                        hl.discard(k)
                        if not hl:
                            _check_header(f, bytes(hbufs[fid]))
                    for w in need.pop((fid, k), []):
                        i = index[id(w)]
                        left[i] -= 1
                        if not left[i]:
                            yield w
                            w.obj = w.view = w.whole = _DONE  # the caller holds it now
        finally:
            for fut in inflight:
                fut.cancel()
            wait(list(inflight))


def _piece_size(entry: FileEntry, k: int) -> int:
    from registry.load.pieces import piece_bounds

    s, e = piece_bounds(entry, k)
    return e - s


def _check_header(f: WeightFile, verified: bytes) -> None:
    """Refuse a file whose verified header differs from the planned one."""
    again = read_header(io.BytesIO(verified), path=f.entry.path, file_size=f.entry.size)
    if again != f.header:
        raise IntegrityError(f.entry.path, reason="its header changed between the planning "
                                                  "read and the verified read (the object was "
                                                  "replaced meanwhile)")
    f.verified_header = True


class TensorSlice:
    """``get_slice(name)``: ``get_shape()``, ``get_dtype()``, and indexing.

    Indexing takes what safetensors' slices take: a tuple of ints and slices
    (steps allowed) over the leading dimensions, or ``...``. The rows the
    first index selects are read (only the pieces under them, plus the
    header's); the rest of the index is applied in memory.
    """

    def __init__(self, reader: WeightsReader, path: str, info: TensorInfo) -> None:
        self.reader, self.path, self.info = reader, path, info

    def get_shape(self) -> list[int]:
        return list(self.info.shape)

    def get_dtype(self) -> str:
        return self.info.dtype

    def __getitem__(self, index: Any) -> Any:
        info, r = self.info, self.reader
        if not isinstance(index, tuple):
            index = (index,)
        if index in ((), (Ellipsis,)) or not info.shape:
            return r.get_tensor(info.name)[index] if info.shape else r.get_tensor(info.name)
        first, rest = index[0], index[1:]
        rows = info.shape[0]
        if isinstance(first, (int, np.integer)):
            i = int(first) + rows if first < 0 else int(first)
            if not 0 <= i < rows:
                raise IndexError(f"{info.name}: index {first} out of range for {rows} rows")
            lo, hi, local = i, i + 1, (0,) + rest
        elif isinstance(first, slice):
            rng = range(*first.indices(rows))
            lo, hi = (min(rng[0], rng[-1]), max(rng[0], rng[-1]) + 1) if len(rng) else (0, 0)
            sel: Any = slice(0, hi - lo) if rng.step == 1 or not len(rng) else \
                [j - lo for j in rng]
            local = (sel,) + rest
        elif first is Ellipsis:
            lo, hi, local = 0, rows, index
        else:
            raise TypeError(f"{info.name}: cannot index with {first!r} (ints and slices only)")
        row_bytes = info.nbytes // rows if rows else 0
        f = r.files[self.path]
        base = f.header.data_start + info.begin
        shape = (hi - lo,) + tuple(info.shape[1:])
        want = _Want(info.name, f, base + lo * row_bytes, base + hi * row_bytes, info.dtype,
                     shape)
        block = None
        for w in r._read([want]):
            block = w.obj
        out = block[local]
        if tuple(out.shape) != tuple(block.shape):
            out = out.copy() if r.framework == "np" else out.clone()
        return r._finish(out)


__all__ = ["LoadStats", "TensorSlice", "WeightFile", "WeightsReader", "dequantized"]
