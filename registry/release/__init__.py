"""Releases: ModelRelease (checkpoint or model directory -> immutable release), conversion,
model cards, per-model policy."""

from __future__ import annotations

from registry.release.convert import RELEASE_DTYPES, dequantize_int4, quantize_int4
from registry.release.model_release import ModelRelease, ReleaseResult, release_prefix

__all__ = ["RELEASE_DTYPES", "ModelRelease", "ReleaseResult", "dequantize_int4",
           "quantize_int4", "release_prefix"]
