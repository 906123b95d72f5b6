"""The weights reader's other sources and bounds (issue 43 items 2-4): a
``registry serve`` mirror over HTTP, tensor-parallel slices reading about 1/N
of a tensor, and memory bounded by the window while tensors stream.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load as st_load
from safetensors.torch import load_file

from registry.load import open_weights
from registry.store import open_store
from tests.conftest import run_cli
from tests.hub_util import publish, tiny_bert
from tests.web_util import serve

REPO = Path(__file__).resolve().parent.parent


def test_load_through_a_mirror_checks_what_it_gets(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    src = tiny_bert(tmp_path / "bert", 1)
    publish(store, src, "tiny", "1")
    assert run_cli("alias", "set", "tiny", "prod", "1", "--store", store).returncode == 0
    ref = st_load((src / "model.safetensors").read_bytes())
    with serve(store, f"sqlite:///{tmp_path / 'i.db'}") as base:
        p = run_cli("load", "tiny@prod", "--from", base, "--json", "--check", cwd=tmp_path)
        assert p.returncode == 0, p.stderr
        doc = json.loads(p.stdout)
        assert doc["version"] == "1" and doc["tensors"] == len(ref)
        from registry.pull.mirror_store import MirrorStore

        with open_weights("tiny@1", store=MirrorStore(base)) as w:
            got = w.state_dict()
        assert all(torch.equal(got[n], ref[n]) for n in ref)
        p = run_cli("load", "tiny@nope", "--from", base, "--check", cwd=tmp_path)
        assert p.returncode == 3 and "Traceback" not in p.stderr


def test_tensor_parallel_slices_read_about_one_nth(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from registry.release import ModelRelease
    from tests.release_util import ledger_row, summary
    from tests.test_load import safetensors_bytes

    piece = 64 * 1024
    monkeypatch.setenv("REGISTRY_PIECE_SIZE", str(piece))
    rng = np.random.default_rng(7)
    big = rng.standard_normal((1024, 256), dtype=np.float32)  # 1 MiB: 16 pieces
    src = tmp_path / "src"
    src.mkdir()
    (src / "model.safetensors").write_bytes(safetensors_bytes({"w": big}))
    (src / "config.json").write_text("{}\n")
    store = open_store(str(tmp_path / "store"))
    ModelRelease(store).publish(src, "tp", "1", ledger=[ledger_row()], eval_summary=summary())
    n = 4
    rows = big.shape[0] // n
    for rank in range(n):
        with open_weights("tp@1", store=store, framework="np") as w:
            part = w.get_slice("w")[rank * rows:(rank + 1) * rows]
            assert np.array_equal(part, big[rank * rows:(rank + 1) * rows])
            # its quarter, at most one piece more at each end, and the header's piece
            assert w.stats.bytes <= big.nbytes // n + 3 * piece, (rank, w.stats.bytes)


def test_memory_is_the_window_plus_what_the_caller_keeps(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A 96 MiB release streamed with an 8 MiB window, each tensor dropped as
    it arrives: the process grows by far less than the release."""
    from registry.release import ModelRelease
    from tests.release_util import ledger_row, summary
    from tests.test_load import safetensors_bytes

    monkeypatch.setenv("REGISTRY_PIECE_SIZE", str(1024 * 1024))
    rng = np.random.default_rng(1)
    tensors = {f"layer{i}": rng.standard_normal((1024, 1024), dtype=np.float32)
               for i in range(24)}  # 24 x 4 MiB
    src = tmp_path / "src"
    src.mkdir()
    (src / "model.safetensors").write_bytes(safetensors_bytes(tensors))
    (src / "config.json").write_text("{}\n")
    del tensors
    url = str(tmp_path / "store")
    ModelRelease(open_store(url)).publish(src, "big", "1", ledger=[ledger_row()],
                                          eval_summary=summary())
    p = subprocess.run([sys.executable, str(REPO / "tests" / "support" / "load_rss_child.py"),
                        url, "big@1", str(8 * 1024 * 1024)], capture_output=True, text=True,
                       cwd=REPO, timeout=300)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["tensors"] == 24 and doc["bytes"] == (src / "model.safetensors").stat().st_size
    grown = (doc["peak"] - doc["base"]) * 1024
    assert grown < 48 * 1024 * 1024, doc  # 96 MiB streamed; the window is 8 MiB


@pytest.mark.parametrize("mapped", [True, False])
def test_local_tensors_are_the_bytes_that_verified(tmp_path: Path, mapped: bool,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """On a local store, tensors come from the file that verified (mapped:
    private mappings of the file opened once; not mapped: copies): a file
    renamed over in the store after the first tensor arrived changes no later
    tensor (not mapped: a piece read after the swap is refused instead), and
    writing into a tensor never reaches the store's file."""
    from registry.errors import PieceMismatchError
    from registry.protocol.layout import release_prefix
    from registry.store import join
    from tests.test_load import publish, reference, same, stored

    monkeypatch.setenv("REGISTRY_PIECE_SIZE", "4096")
    store = open_store(str(tmp_path / "store"))
    publish(store, tmp_path, "1")
    key = join(release_prefix("tiny", "1"), "model.safetensors")
    original = stored(store, "1")
    ref = reference(store, "1")
    path = tmp_path / "store" / key
    with open_weights("tiny@1", store=store, mapped=mapped) as w:
        it = iter(w)
        got = dict([next(it)])
        other = bytearray(original)
        n = int.from_bytes(original[:8], "little")
        other[8 + n:] = bytes(b ^ 0x55 for b in original[8 + n:])
        swap = path.with_name("swap.tmp")
        swap.write_bytes(bytes(other))
        swap.replace(path)  # a writer's rename over the object
        try:
            got.update(it)
        except PieceMismatchError:
            assert not mapped  # a mapped reader reads only the file it opened first
    assert all(same(got[k], ref[k]) for k in got)
    if mapped:
        assert got.keys() == ref.keys()
    path.write_bytes(original)
    with open_weights("tiny@1", store=store, mapped=mapped) as w:
        a = w.get_tensor("a")
    a.fill_(7.0)
    assert path.read_bytes() == original


def _scribble(path: Path, start: int) -> None:
    """A store writer modifying the file in place (no rename): garbage over
    every byte from ``start`` on."""
    size = path.stat().st_size
    with open(path, "r+b") as f:
        os.pwrite(f.fileno(), bytes((i * 131 + 7) & 0xFF for i in range(size - start)), start)


@pytest.mark.parametrize("mapped", ["cached", "direct", "plain", False])
def test_an_in_place_write_after_the_load_changes_no_tensor(
        tmp_path: Path, mapped: bool | str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tensors read from a local store (each way bytes land:
    ``cached`` from the page cache with RWF_NOWAIT, ``direct`` with O_DIRECT,
    ``plain`` preadv; False: ordinary memory, preadv per piece) are the bytes that
    verified: a writer with write access to the store who modifies the file
    in place after the load (or while it runs) changes none of them."""
    import registry.load.direct as direct
    from registry.errors import PieceMismatchError
    from registry.protocol.layout import release_prefix
    from registry.store import join
    from tests.test_load import publish, same, stored

    opened: list[int] = []
    if mapped in ("direct", "plain"):
        monkeypatch.setattr(direct, "_NOWAIT", 0)  # never answer from the page cache
    if mapped == "plain":
        monkeypatch.setattr(direct, "_DIRECT", 0)
    if mapped == "direct":
        real = direct.Descriptors.__init__

        def spy(self: direct.Descriptors, fd: int) -> None:
            real(self, fd)
            opened.append(self.direct)

        monkeypatch.setattr(direct.Descriptors, "__init__", spy)
    mapped = bool(mapped)
    monkeypatch.setenv("REGISTRY_PIECE_SIZE", "4096")
    store = open_store(str(tmp_path / "store"))
    publish(store, tmp_path, "1")
    original = stored(store, "1")
    pristine = tmp_path / "pristine.safetensors"
    pristine.write_bytes(original)
    ref = load_file(pristine)
    path = tmp_path / "store" / join(release_prefix("tiny", "1"), "model.safetensors")
    data = 8 + int.from_bytes(original[:8], "little")

    with open_weights("tiny@1", store=store, mapped=mapped) as w:
        got = w.state_dict()
    _scribble(path, data)
    assert path.read_bytes() != original
    assert got.keys() == ref.keys()
    assert all(same(got[k], ref[k]) for k in ref), [k for k in ref if not same(got[k], ref[k])]

    # while the load runs: one piece at a time, the file scribbled over right
    # after the first tensor arrives; what arrived (and any tensor of a piece
    # that already verified) stays the released bytes, what is read after is
    # refused
    path.write_bytes(original)
    got = {}
    with open_weights("tiny@1", store=store, mapped=mapped, workers=1, window_bytes=1) as w:
        it = iter(w)
        name, t = next(it)
        got[name] = t
        _scribble(path, data)
        with pytest.raises(PieceMismatchError):
            for name, t in it:
                got[name] = t
    assert got and all(same(got[k], ref[k]) for k in got), \
        [k for k in got if not same(got[k], ref[k])]
    if opened:  # the direct case: the store's file system (ext4 here) took O_DIRECT
        assert all(fd >= 0 for fd in opened), opened
