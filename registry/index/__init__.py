"""The SQL index: derived from the store, rebuildable, queried for gates (DESIGN section 6).

Rooms it may import (tests/test_house.py keeps this list): errors, host, rules, obs, store, protocol, formats, gating, checkpoint, lifecycle, refs, release.
"""

from __future__ import annotations

from registry.index.db import DEFAULT_DB, Index, db_url

__all__ = ["DEFAULT_DB", "Index", "db_url"]
