"""Records, in order, what the local store makes durable: each durable file it
opens and each folder it fsyncs (the real calls still run)."""

from __future__ import annotations

import os

import pytest

import registry.store.local as local_mod


def record_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """From now on in this test: ``("open", path)`` for each durable file the
    local store opens and ``("fsync-dir", path)`` for each folder it fsyncs,
    appended to the list returned (real paths)."""
    events: list[tuple[str, str]] = []
    real_fsync, real_open = local_mod.fsync_path, local_mod._DurableFile.__init__

    def fsync(path: str) -> None:
        if os.path.isdir(path):
            events.append(("fsync-dir", os.path.realpath(path)))
        real_fsync(path)

    def durable_init(self: object, path: str, mode: str, **kw: object) -> None:
        events.append(("open", os.path.realpath(path)))
        real_open(self, path, mode, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(local_mod, "fsync_path", fsync)
    monkeypatch.setattr(local_mod._DurableFile, "__init__", durable_init)
    return events
