"""Releases as OCI ModelPack artifacts: the mapping, a client, push, pull and import.

May import: the root modules, store/, pull/, lifecycle/, release/ (push's gates,
import's publish), model_sig, trust; never cli/ or web/. The names load on first
use (:mod:`registry.host.lazy`).


Rooms it may import (tests/test_house.py keeps this list): errors, host, rules, obs, store, protocol, formats, gating, api, lifecycle, pull, release, trust.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from registry.host.lazy import exports

if TYPE_CHECKING:
    from registry.oci.auth import Credentials
    from registry.oci.client import OciClient
    from registry.oci.pull import import_oci, pull_oci
    from registry.oci.push import PushResult, push
    from registry.oci.ref import OciRef, is_oci, parse_ref

__getattr__, __dir__, __all__ = exports(__name__, {
    "registry.oci.auth": ("Credentials",),
    "registry.oci.client": ("OciClient",),
    "registry.oci.pull": ("import_oci", "pull_oci"),
    "registry.oci.push": ("PushResult", "push"),
    "registry.oci.ref": ("OciRef", "is_oci", "parse_ref"),
})
