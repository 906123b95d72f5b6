"""The OCI client's logins and redirects against a registry that misbehaves (issue 45).

Two real HTTP servers on loopback (stdlib ``http.server`` in threads): a
registry that asks for a Bearer token (its realm wants Basic credentials) and
redirects blob downloads to a second origin, the way ECR, GHCR and Harbor on
S3 do; the second origin logs what it is sent. The credentials must reach the
registry and its token realm, never the other origin, and the redirected
bytes are still checked against the digest. Credentials also come from a
Docker config's ``auths`` and from a credential helper it names.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from registry.errors import IntegrityError, StorageError, UsageError
from registry.oci.auth import Credentials
from registry.oci.client import OciClient
from registry.oci.ref import parse_ref

DATA = b"weights" * 1000
HEX = hashlib.sha256(DATA).hexdigest()
BASIC = "Basic " + base64.b64encode(b"alice:pw").decode()


class _Handler(BaseHTTPRequestHandler):
    server: Any

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, status: int, body: bytes = b"", **headers: str) -> None:
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k.replace("_", "-"), v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802
        s = self.server
        s.seen.append((self.path, self.headers.get("Authorization")))
        if s.role == "cdn":
            self._send(200, s.body)
            return
        if self.path.startswith("/token"):
            if self.headers.get("Authorization") != BASIC:
                self._send(401)
                return
            self._send(200, json.dumps({"token": "T0K"}).encode())
            return
        if self.headers.get("Authorization") != "Bearer T0K":
            realm = f"http://{s.server_address[0]}:{s.server_address[1]}/token"
            self._send(401, WWW_Authenticate=f'Bearer realm="{realm}",service="reg",'
                                             'scope="repository:r:pull"')
            return
        self._send(307, Location=s.location)


def _server(role: str) -> ThreadingHTTPServer:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.role, srv.seen, srv.body, srv.location = role, [], DATA, ""  # type: ignore[attr-defined]
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


@pytest.fixture
def servers() -> Iterator[tuple[Any, Any]]:
    reg, cdn = _server("registry"), _server("cdn")
    # another origin: the same address under another name and port
    reg.location = f"http://localhost:{cdn.server_address[1]}/blob"
    yield reg, cdn
    for s in (reg, cdn):
        s.shutdown()
        s.server_close()


def test_credentials_never_follow_a_redirect_to_another_origin(servers: tuple[Any, Any]) -> None:
    reg, cdn = servers
    ref = parse_ref(f"oci://127.0.0.1:{reg.server_address[1]}/r")
    with OciClient(ref, insecure=True, credentials=Credentials("alice", "pw")) as c:
        assert b"".join(c.blob(HEX, len(DATA))) == DATA
        assert ("/token?service=reg&scope=repository%3Ar%3Apull", BASIC) in reg.seen
        assert any(auth == "Bearer T0K" for _, auth in reg.seen)
        assert cdn.seen and all(auth is None for _, auth in cdn.seen)
        cdn.body = DATA[:-1] + b"X"  # the other origin answers other bytes
        with pytest.raises(IntegrityError):
            b"".join(c.blob(HEX, len(DATA)))
        cdn.body = DATA[:-7]  # or fewer
        with pytest.raises(IntegrityError, match="truncated"):
            b"".join(c.blob(HEX, len(DATA)))
        reg.location = "file:///etc/passwd"
        with pytest.raises(StorageError, match="redirected"):
            b"".join(c.blob(HEX, len(DATA)))


def test_credentials_from_a_docker_config(servers: tuple[Any, Any], tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    reg, cdn = servers
    host = f"127.0.0.1:{reg.server_address[1]}"
    (tmp_path / "config.json").write_text(json.dumps(
        {"auths": {host: {"auth": base64.b64encode(b"alice:pw").decode()}}}))
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    with OciClient(parse_ref(f"oci://{host}/r"), insecure=True) as c:
        assert b"".join(c.blob(HEX, len(DATA))) == DATA
    assert any(auth == BASIC for _, auth in reg.seen)
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "none"))
    with OciClient(parse_ref(f"oci://{host}/r"), insecure=True) as c, \
            pytest.raises(StorageError, match="401"):
        b"".join(c.blob(HEX, len(DATA)))


def test_credentials_from_a_credential_helper(servers: tuple[Any, Any], tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    reg, _ = servers
    host = f"127.0.0.1:{reg.server_address[1]}"
    helper = tmp_path / "bin" / "docker-credential-testhelper"
    helper.parent.mkdir()
    # the Docker credential-helper protocol: the server URL on stdin, JSON out
    helper.write_text("#!/bin/sh\nread host\necho \"$host\" > \"$0.asked\"\n"
                      'echo \'{"ServerURL": "x", "Username": "alice", "Secret": "pw"}\'\n')
    helper.chmod(0o755)
    (tmp_path / "config.json").write_text(json.dumps({"credHelpers": {host: "testhelper"}}))
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    monkeypatch.setenv("PATH", f"{helper.parent}:{os.environ['PATH']}")
    with OciClient(parse_ref(f"oci://{host}/r"), insecure=True) as c:
        assert b"".join(c.blob(HEX, len(DATA))) == DATA
    assert Path(f"{helper}.asked").read_text().strip() == host
    assert any(auth == BASIC for _, auth in reg.seen)


def test_plain_http_only_on_loopback() -> None:
    with pytest.raises(UsageError, match="loopback"):
        OciClient(parse_ref("oci://registry.example.com/r"), insecure=True)
    OciClient(parse_ref("oci://registry.example.com/r"), insecure=True,
              allow_insecure_remote=True).close()
    for bad in ("oci://h/UPPER", "oci://h/r:tag:x", "oci://h/r@sha256:12", "http://h/r",
                "oci:///r"):
        with pytest.raises(UsageError):
            parse_ref(bad)
