"""The SQL index: derived from the store, rebuildable, queried for gates (DESIGN section 6).
The names load on first use (:mod:`registry.host.lazy`): :mod:`registry.index.lite`
reads a SQLite index without SQLAlchemy.

Rooms it may import (tests/test_house.py keeps this list): errors, host, rules, obs, store, protocol, formats, gating, checkpoint, lifecycle, refs, release.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from registry.host.lazy import exports

if TYPE_CHECKING:
    from registry.index.db import Index
    from registry.index.lite import DEFAULT_DB, db_url

__getattr__, __dir__, __all__ = exports(__name__, {
    "registry.index.db": ("Index",),
    "registry.index.lite": ("DEFAULT_DB", "db_url"),
})
