"""Releases: ModelRelease (checkpoint or model directory -> immutable release), conversion,
model cards, per-model policy. The names load on first use (:mod:`registry.lazy`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from registry.lazy import exports

if TYPE_CHECKING:
    from registry.release.convert import RELEASE_DTYPES, dequantize_int4, quantize_int4
    from registry.release.model_release import ModelRelease, ReleaseResult, release_prefix

_FROM = {
    "RELEASE_DTYPES": "registry.release.convert",
    "dequantize_int4": "registry.release.convert",
    "quantize_int4": "registry.release.convert",
    "ModelRelease": "registry.release.model_release",
    "ReleaseResult": "registry.release.model_release",
    "release_prefix": "registry.release.model_release",
}
__getattr__, __dir__ = exports(__name__, _FROM)

__all__ = sorted(_FROM)
