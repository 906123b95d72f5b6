"""Issue 13 item 11: a ranged GET must answer 206 with the requested
Content-Range, and every byte a release is derived from is checked against
its source before the commit. Through a proxy that ignores ``Range`` (answers
200 with the whole object), ``release create --dtype`` and ``publish
s3://... --dtype`` used to commit garbage weights that then verified."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

import registry.store.local as local_mod
from registry.errors import IntegrityError, StorageError
from registry.release import ModelRelease
from registry.store import Store, open_store
from tests.conftest import proxied, run_cli
from tests.release_util import ledger_row, summary
from tests.support.faultproxy import Action, FaultProxy, Request, ignore_range
from tests.test_loongsage import gate_files, hf_dir
from tests.test_release import checkpoint


def test_a_200_for_a_range_is_an_error(s3_bucket: str, proxy: FaultProxy) -> None:
    url = f"s3://{s3_bucket}/root"
    open_store(url).write_bytes("obj", bytes(range(256)) * 64)
    proxy.rules.append(ignore_range)
    store = proxied(url, proxy)
    with pytest.raises(StorageError, match="ignores Range"):
        store.read_range("obj", 10, 20)
    with pytest.raises(StorageError, match="ignores Range"), store.open_read("obj") as f:
        f.seek(100)
        f.read(10)
    with pytest.raises(StorageError, match="ignores Range"):
        list(store.iter_range("obj", 5, 50))
    assert b"".join(store.iter_read("obj")) == bytes(range(256)) * 64  # a plain GET is fine


def test_conversion_through_a_proxy_ignoring_range_commits_nothing(
        s3_bucket: str, proxy: FaultProxy, tmp_path: Path) -> None:
    url = f"s3://{s3_bucket}/root"
    store = open_store(url)
    checkpoint(store)
    src = hf_dir(tmp_path)
    for name in ("model.safetensors", "config.json"):
        store.write_bytes(f"incoming/{name}", (src / name).read_bytes())
    proxy.rules.append(ignore_range)
    ledger, evals = gate_files(tmp_path)
    env = {"AWS_ENDPOINT_URL": proxy.endpoint}
    common = ["--ledger", str(ledger), "--evals", str(evals), "--dtype", "bf16", "--store", url]
    r = run_cli("release", "create", "--run", "r1", "--step", "10", "--model-id", "tiny",
                "--version", "1", *common, env=env)
    assert r.returncode == 6 and "ignores Range" in r.stderr, r.stderr
    r = run_cli("publish", f"{url}/incoming", "--model-id", "hf", "--version", "1", *common,
                env=env)
    assert r.returncode == 6 and "ignores Range" in r.stderr, r.stderr
    assert store.walk_files("models") == {}


def _flip_ranges(req: Request) -> Action | None:
    if req.op == "GetObject" and "Range" in req.headers and req.key.endswith(".safetensors"):
        return Action("corrupt")
    return None


def test_conversion_checks_its_source_on_s3(s3_bucket: str, proxy: FaultProxy) -> None:
    """A server that answers 206 with wrong bytes: the conversion's hash of
    what it read differs from the step's manifest; nothing is committed."""
    url = f"s3://{s3_bucket}/root"
    checkpoint(open_store(url))
    proxy.rules.append(_flip_ranges)
    store = proxied(url, proxy)
    rel = ModelRelease(store)
    # The step verifies first (a streamed GET, not ranged); the conversion's
    # ranged reads come back altered.
    with pytest.raises(IntegrityError, match="bytes read for conversion differ"):
        rel.create("r1", 10, "tiny", "1", ledger=[ledger_row()], eval_summary=summary(),
                   dtype="bf16")
    assert open_store(url).walk_files("models") == {}


class _Corrupt(io.RawIOBase):
    """A local file whose bytes past ``at`` read back altered (a bad disk read)."""

    def __init__(self, path: str, at: int) -> None:
        self._f = open(path, "rb")  # noqa: SIM115 - closed in close()
        self._at = at

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._f.seek(offset, whence)

    def tell(self) -> int:
        return self._f.tell()

    def readinto(self, b: object) -> int:
        pos = self._f.tell()
        n = self._f.readinto(b)  # type: ignore[arg-type]
        view = memoryview(b).cast("B")  # type: ignore[arg-type]
        if pos <= self._at < pos + n:
            view[self._at - pos] ^= 0xFF
        return n

    def close(self) -> None:
        self._f.close()
        super().close()


def test_conversion_checks_its_source_on_local_disk(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store(str(tmp_path / "store"))
    checkpoint(store)
    key = "runs/r1/ckpt/step-000010/model.safetensors"
    real_open = local_mod.LocalStore.open_read

    def open_read(self: Store, k: str):  # type: ignore[no-untyped-def]
        if k == key and open_read.armed:  # type: ignore[attr-defined]
            return io.BufferedReader(_Corrupt(self.path(k), self.info(k).size - 3))
        return real_open(self, k)  # type: ignore[arg-type]

    open_read.armed = False  # type: ignore[attr-defined]
    monkeypatch.setattr(local_mod.LocalStore, "open_read", open_read)
    rel = ModelRelease(store)
    rel.on_commit.clear()
    # Armed after the step's own verification: only the conversion's reads differ.
    real_header = ModelRelease._release

    def armed(self, *a, **kw):  # type: ignore[no-untyped-def]
        open_read.armed = True  # type: ignore[attr-defined]
        return real_header(self, *a, **kw)

    monkeypatch.setattr(ModelRelease, "_release", armed)
    with pytest.raises(IntegrityError, match="bytes read for conversion differ"):
        rel.create("r1", 10, "tiny", "1", ledger=[ledger_row()], eval_summary=summary(),
                   dtype="bf16")
    assert not (tmp_path / "store" / "models" / "tiny" / "1").exists()
