"""A committed release as :class:`ModelRelease` answers it: names, URL, manifest,
the gates it passed, and what publish noted on the way (issue 44 item 7: split
from :mod:`registry.release.model_release`, which re-exports it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from registry.gating.gates import GateResult
from registry.protocol.manifest import Manifest


@dataclass(frozen=True, slots=True)
class ReleaseResult:
    """A committed release: its names, URL, manifest and the gates it passed."""

    model_id: str
    version: str
    url: str
    manifest: Manifest
    gates: tuple[GateResult, ...] = field(default=())
    #: ``(link, target)`` of each symbolic link publish followed out of its
    #: source directory (``follow_symlinks``, registry.host.sourcedir).
    followed: tuple[tuple[str, str], ...] = field(default=())
    #: ``(path, means)`` for each file read from an S3 source without a
    #: manifest: the server's checksums compared (``"crc32"``, ``"md5"``,
    #: ``"sha256+md5"`` ...) or ``"read twice"`` where it keeps none
    #: (registry.release.source_check.verify_object, issue 47).
    source_checks: tuple[tuple[str, str], ...] = field(default=())
    #: ``(format, paths)`` of each set of weights other than the safetensors
    #: that ``include`` let through (registry.formats.modeldir.check_other_weights).
    other_weights: tuple[tuple[str, tuple[str, ...]], ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        out = {"model_id": self.model_id, "version": self.version, "url": self.url,
               "manifest_sha256": self.manifest.digest, "files": len(self.manifest.files),
               "bytes": self.manifest.total_size, "source": self.manifest.meta.get("source"),
               "gates": [g.to_dict() for g in self.gates]}
        if self.other_weights:
            out["other_weights"] = {k: list(v) for k, v in self.other_weights}
        if self.source_checks:
            out["source_checks"] = dict(self.source_checks)
        if self.followed:
            out["followed_symlinks"] = [{"link": a, "target": b} for a, b in self.followed]
        return out
