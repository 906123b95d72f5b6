"""``registry serve`` stops cleanly and bounds idle connections (issue 51, items 5 and 6).

A real server process, real sockets: a client reading one byte a second, an
idle connection, a client trickling its request head (slowloris), then
SIGTERM. Checked: the exit status, what each socket saw, and that nothing is
reported complete that was not; never a time.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tests.hub_util import publish, tiny_bert

BIG = 16 << 20  # more than the kernel's socket buffers hold


@pytest.fixture(scope="module")
def big_store(tmp_path_factory: pytest.TempPathFactory) -> str:
    from safetensors.numpy import save_file

    root = tmp_path_factory.mktemp("big")
    src = tiny_bert(root, 1)
    save_file({"w": np.random.default_rng(0).standard_normal(BIG // 4).astype(np.float32)},
              str(src / "model.safetensors"), metadata={"format": "pt"})
    store = str(root / "store")
    publish(store, src, "big", "1")
    return store


def start(store: str, tmp_path: Path, *args: str) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "registry", "serve", "--port", "0", "--store", store,
         "--db", f"sqlite:///{tmp_path / 'i.db'}", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    m = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
    if m is None:
        proc.kill()
        raise AssertionError(f"serve did not start: {line!r} {proc.communicate()[1]}")
    return proc, int(m.group(1))


_OPEN: list[socket.socket] = []


@pytest.fixture(autouse=True)
def _close_sockets() -> object:
    yield
    while _OPEN:
        _OPEN.pop().close()


def connect(port: int, rcvbuf: int | None = None) -> socket.socket:
    s = socket.socket()
    _OPEN.append(s)
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.connect(("127.0.0.1", port))
    return s


def closed_by_server(s: socket.socket, limit: float = 60.0) -> bool:
    """Whether the server closes ``s`` (EOF or reset) while it sends nothing
    more than an answer, waiting up to ``limit`` seconds."""
    s.settimeout(limit)
    try:
        while s.recv(65536):
            pass
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False
    return True


def test_sigterm_drains_a_slow_reader_up_to_the_deadline_then_exits_0(
        big_store: str, tmp_path: Path) -> None:
    proc, port = start(big_store, tmp_path, "--mirror-cache", str(tmp_path / "m"),
                       "--drain-timeout", "2", "--header-timeout", "2", "--keep-alive", "1")
    try:
        # a 1-byte/s reader of a file larger than the socket buffers
        slow = connect(port, rcvbuf=4096)
        slow.sendall(b"GET /registry/big/resolve/1/model.safetensors HTTP/1.1\r\n"
                     b"Host: 127.0.0.1\r\n\r\n")
        got = bytearray()
        done, fast = threading.Event(), threading.Event()

        def trickle() -> None:
            try:
                while True:
                    b = slow.recv(1)
                    if not b:
                        break
                    got.extend(b)
                    if len(got) > 4096 and not fast.is_set():
                        time.sleep(1.0)
            except OSError:
                pass
            done.set()
        reader = threading.Thread(target=trickle, daemon=True)
        reader.start()
        while len(got) < 4096 + 3:  # the head and a first block arrived
            assert not done.is_set() and proc.poll() is None, bytes(got[:300])
            time.sleep(0.05)
        head = bytes(got).split(b"\r\n\r\n")[0].decode()
        assert head.startswith("HTTP/1.1 200"), head
        length = int(re.search(r"content-length: (\d+)", head, re.I).group(1))  # type: ignore[union-attr]
        assert length > BIG
        # an idle connection and a slowloris head are closed by the server itself
        idle = connect(port)
        assert closed_by_server(idle)
        loris = connect(port)
        loris.sendall(b"GET /api/v1/models HTTP/1.1\r\n")
        for _ in range(100):
            try:
                loris.sendall(b"X")
            except OSError:
                break
            time.sleep(0.1)
        assert closed_by_server(loris)
        # SIGTERM: nothing new accepted, the slow reader cut at the deadline, exit 0
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0, proc.stderr.read() if proc.stderr else ""
        fast.set()  # what the kernel still holds for the reader: read it all now
        assert done.wait(120)
        body = bytes(got).split(b"\r\n\r\n", 1)[1]
        assert len(body) < length  # a short read: never reported complete
        with pytest.raises(ConnectionRefusedError):
            connect(port)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def test_sigterm_on_an_idle_server_exits_0_at_once(big_store: str, tmp_path: Path) -> None:
    proc, port = start(big_store, tmp_path)
    try:
        s = connect(port)
        s.sendall(b"GET /api/v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert s.recv(12).startswith(b"HTTP/1.1 200")
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        assert closed_by_server(s)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
