"""The SQL index: derived from the store, rebuildable, queried for gates (DESIGN section 6)."""

from __future__ import annotations

from registry.index.db import DEFAULT_DB, Index, db_url

__all__ = ["DEFAULT_DB", "Index", "db_url"]
