"""``registry serve``: a read-only web page and JSON API over a Registry.

Needs the ``web`` extra (``pip install 'modeldir-registry[web]'``).

Rooms it may import (tests/test_house.py keeps this list): any room.
"""

from __future__ import annotations

from registry.web.app import create_app

__all__ = ["create_app"]
