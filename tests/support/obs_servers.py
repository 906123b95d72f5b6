"""Real observability back ends for the tests of issue 48: a Prometheus server
(Debian ``prometheus``), a Pushgateway (Debian ``prometheus-pushgateway``) and an
OTLP/HTTP receiver (PyPI ``oteltap``), each a process on a free loopback port.

A missing one skips its tests, except where CI sets ``REGISTRY_REQUIRE_OBS=1``:
then it fails them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from tests.support.servers import free_port, reap


def require(binary: str, what: str) -> str:
    """The path of ``binary``; skips (fails under REGISTRY_REQUIRE_OBS=1) without it."""
    found = shutil.which(binary) or (str(Path(sys.executable).parent / binary)
                                     if (Path(sys.executable).parent / binary).exists()
                                     else None)
    if found is None:
        message = f"{binary} not installed ({what})"
        if os.environ.get("REGISTRY_REQUIRE_OBS") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return found


def _stop(proc: subprocess.Popen[Any]) -> None:
    """Terminate ``proc`` (killed after 20 s) and close its stdout pipe."""
    proc.terminate()
    reap(proc, 20)


def _wait_http(url: str, proc: subprocess.Popen[Any], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"{url}: the server exited ({proc.returncode})")
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _wait_port(port: int, proc: subprocess.Popen[Any], timeout: float = 30) -> None:
    import socket

    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"port {port}: the server exited ({proc.returncode})")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        if time.monotonic() > deadline:
            raise AssertionError(f"port {port}: nothing listens after {timeout} s")
        time.sleep(0.05)


class Prometheus:
    """``prometheus`` scraping ``target`` (host:port) every second, with the
    bearer token in ``token_file`` when given."""

    def __init__(self, root: Path, target: str, *, token_file: Path | None = None) -> None:
        binary = require("prometheus", "Debian package prometheus")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        auth = (f"    authorization:\n      credentials_file: {token_file}\n"
                if token_file else "")
        root.mkdir(parents=True, exist_ok=True)
        config = root / "prometheus.yml"
        config.write_text("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
                          "scrape_configs:\n  - job_name: registry\n"
                          f"{auth}    static_configs:\n      - targets: ['{target}']\n")
        self.proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--web.listen-address=127.0.0.1:{self.port}",
             f"--storage.tsdb.path={root / 'tsdb'}", "--log.level=warn"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_http(self.url + "/-/ready", self.proc)

    def query(self, promql: str) -> list[dict[str, Any]]:
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        doc = json.loads(urllib.request.urlopen(url, timeout=10).read())
        assert doc["status"] == "success", doc
        return doc["data"]["result"]  # type: ignore[no-any-return]

    def value(self, promql: str, timeout: float = 30) -> float:
        """The single value of ``promql``, waiting (scrapes are every second)
        until the query has one."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(promql)
            if result:
                return float(result[0]["value"][1])
            if time.monotonic() > deadline:
                raise AssertionError(f"{promql}: no value after {timeout} s")
            time.sleep(0.5)

    def settled(self, promql: str, want: float, timeout: float = 30) -> float:
        """The value of ``promql`` once it is ``want`` (or the last one after
        ``timeout`` s): a scrape a second, so the newest sample may predate
        the requests just made."""
        deadline = time.monotonic() + timeout
        while True:
            got = self.value(promql, timeout)
            if got == want or time.monotonic() > deadline:
                return got
            time.sleep(0.5)

    def stop(self) -> None:
        _stop(self.proc)


class Pushgateway:
    """``prometheus-pushgateway`` on a free port."""

    def __init__(self, root: Path) -> None:
        binary = require("prometheus-pushgateway", "Debian package prometheus-pushgateway")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([binary, f"--web.listen-address=127.0.0.1:{self.port}",
                                      "--log.level=warn"], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, cwd=root)
        _wait_http(self.url + "/-/ready", self.proc)

    def metrics(self) -> str:
        return urllib.request.urlopen(self.url + "/metrics", timeout=10).read().decode()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=20)


class OtlpReceiver:
    """``oteltap --port P``: every span it receives, as a dict (OTLP JSON).

    ``collect=False`` (a benchmark): the spans are received and dropped, not
    parsed in this process."""

    def __init__(self, *, collect: bool = True) -> None:
        binary = require("oteltap", "PyPI package oteltap")
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.spans: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self.proc = subprocess.Popen([binary, "--port", str(self.port)],
                                     stdout=subprocess.PIPE if collect else subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, text=True)
        if not collect:
            _wait_port(self.port, self.proc)
            return
        assert self.proc.stdout is not None
        first = self.proc.stdout.readline()
        assert "Listening" in first, first
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                doc = json.loads(line)
                if "spanId" in doc:
                    with self._lock:
                        self.spans.append(doc)

    def wait_for(self, name: str, timeout: float = 30) -> list[dict[str, Any]]:
        """Every span received so far, once one named ``name`` is among them."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                if any(s["name"] == name for s in self.spans):
                    return list(self.spans)
            if time.monotonic() > deadline:
                raise AssertionError(f"no span {name!r} after {timeout} s: "
                                     f"{[s['name'] for s in self.spans]}")
            time.sleep(0.2)

    def stop(self) -> None:
        _stop(self.proc)
