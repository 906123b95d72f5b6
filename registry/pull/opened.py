"""Kept import path of the trust function: :mod:`registry.trust.release`.

``registry.pull.opened.open_release`` is :func:`registry.trust.release.open_release`
(issue 50: one module decides trust; this module only delegates).
"""

from __future__ import annotations

from registry.trust.release import (
    DEFAULT_ALIAS,
    OpenedRelease,
    default_version,
    open_release,
    resolve_for_pull,
    start_signature_check,
)

__all__ = ["DEFAULT_ALIAS", "OpenedRelease", "default_version", "open_release",
           "resolve_for_pull", "start_signature_check"]
