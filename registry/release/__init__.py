"""Releases: ModelRelease (checkpoint or model directory -> immutable release), conversion,
model cards, per-model policy. The names load on first use (:mod:`registry.host.lazy`).

Rooms it may import (tests/test_house.py keeps this list): errors, host, rules, obs, store, protocol, formats, gating, checkpoint, events, lifecycle, refs, trust.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from registry.host.lazy import exports

if TYPE_CHECKING:
    from registry.release.convert import RELEASE_DTYPES, dequantize_int4, quantize_int4
    from registry.release.model_release import ModelRelease, ReleaseResult, release_prefix

__getattr__, __dir__, __all__ = exports(__name__, {
    "registry.release.convert": ("RELEASE_DTYPES", "dequantize_int4", "quantize_int4"),
    "registry.release.model_release": ("ModelRelease", "ReleaseResult", "release_prefix"),
})
