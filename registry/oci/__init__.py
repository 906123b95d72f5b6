"""Releases as OCI ModelPack artifacts: the mapping, a client, push, pull and import.

May import: the root modules, store/, pull/, lifecycle/, release/ (push's gates,
import's publish), model_sig, trust; never cli/ or web/.
"""

from __future__ import annotations

from registry.oci.ref import OciRef, is_oci, parse_ref

__all__ = ["OciRef", "is_oci", "parse_ref"]
