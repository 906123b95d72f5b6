"""The botocore session behind each S3 store's s3fs filesystem.

s3fs gives every filesystem an ``AioSession`` of its own, and each session
parses botocore's S3 service model and endpoint rules from JSON again: about
150 ms of CPU before the first request of every store a process opens (a pull
of several releases, the web server's stores, a test). The parsed models are
immutable data, so one botocore ``Loader`` per data path serves every session
of the process; everything else a session holds (credentials, profile,
configuration, event hooks) stays per store, as s3fs makes it.
"""

from __future__ import annotations

import threading
from typing import Any

from aiobotocore.session import AioSession
from botocore.loaders import Loader, create_loader

_LOADERS: dict[str | None, Loader] = {}
_LOCK = threading.Lock()


def shared_loader(data_path: str | None) -> Loader:
    """The process's botocore loader for ``data_path`` (``AWS_DATA_PATH``,
    None for botocore's own data); its caches fill on first use."""
    with _LOCK:
        loader = _LOADERS.get(data_path)
        if loader is None:
            loader = _LOADERS[data_path] = create_loader(data_path)
        return loader


def new_session(**kwargs: Any) -> AioSession:
    """An ``AioSession(**kwargs)`` -- what s3fs would create from the same
    leftover storage options (``profile=...``) -- reading service models
    through :func:`shared_loader`."""
    session = AioSession(**kwargs)
    session.register_component(
        "data_loader", shared_loader(session.get_config_variable("data_path")))
    return session
