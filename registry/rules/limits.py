"""Every size and count limit on what the registry reads from a store, in one place.

A store writer (full bucket rights, no signing key) controls every byte the
registry reads; these bounds keep what one hostile document can cost in memory
and time proportional to a cap, not to what the writer chose. A document over
its limit is refused with one line naming the file and the limit (never parsed
in part, never a traceback). Sizes are in bytes.

Where a real document could legitimately exceed a cap (a model with millions
of tensors), the limit is an environment variable's default; the variable is
named beside it.
"""

from __future__ import annotations

import os
import re
from typing import Any


#: name -> (environment variable, default). Each limit is read when it is
#: used (``limits.MAX_TENSORS``: :func:`__getattr__`), not when this module is
#: imported, so a process that sets the variable after importing the registry
#: (a notebook, a test, a long-lived server's configuration reload) is obeyed.
_LIMITS: dict[str, tuple[str, int]] = {
    #: DCP ``.metadata`` (one pickle for the whole checkpoint; grows with tensors x shards).
    "MAX_DCP_METADATA_BYTES": ("REGISTRY_MAX_DCP_METADATA_BYTES", 256 << 20),
    #: any one small object read whole (``Store.read_bytes``): documents, pointers, signatures
    "MAX_READ_BYTES": ("REGISTRY_MAX_READ_BYTES", 256 << 20),
    #: MANIFEST.json (about 150 bytes a file: ~100,000 files, or fewer with piece hashes)
    "MAX_MANIFEST_BYTES": ("REGISTRY_MAX_MANIFEST_BYTES", 16 << 20),
    #: files listed in one MANIFEST.json
    "MAX_MANIFEST_FILES": ("REGISTRY_MAX_MANIFEST_FILES", 200_000),
    #: any JSON document of the registry's own formats read from a store (trainer
    #: state, config, ledger, eval summary, heads, revocations, policies, pull records)
    "MAX_JSON_BYTES": ("REGISTRY_MAX_JSON_BYTES", 16 << 20),
    #: a document rendered into a web page (model card, ledger.json, a head): at
    #: most the size the manifest lists and never more than this
    "MAX_RENDERED_BYTES": ("REGISTRY_MAX_RENDERED_BYTES", 1 << 20),
    #: a pull record or stamp of the serving-host cache
    "MAX_RECORD_BYTES": ("REGISTRY_MAX_RECORD_BYTES", 16 << 20),
    #: a pointer, alias, claim, lease or commit marker: one short line or a small
    #: JSON object (a store writer's 200 MB "pointer" is refused unread)
    "MAX_POINTER_BYTES": ("REGISTRY_MAX_POINTER_BYTES", 64 << 10),
    #: a signature bundle (``model.sig``: a DSSE envelope and a certificate chain)
    "MAX_SIGNATURE_BYTES": ("REGISTRY_MAX_SIGNATURE_BYTES", 16 << 20),
    #: values (objects, arrays, strings, numbers) in one JSON document, counted
    #: before it is parsed: within MAX_JSON_BYTES, ``[{},{},...]`` would
    #: otherwise build millions of objects (hundreds of MB)
    "MAX_JSON_VALUES": ("REGISTRY_MAX_JSON_VALUES", 2_000_000),
    #: tensors in one safetensors header, and entries of one
    #: ``model.safetensors.index.json`` weight_map (the largest public
    #: checkpoints hold about 100,000 tensors in all)
    "MAX_TENSORS": ("REGISTRY_MAX_TENSORS", 500_000),
    #: an OCI manifest or index read from an OCI registry (distribution's own
    #: cap on a pushed manifest is 4 MiB)
    "MAX_OCI_MANIFEST_BYTES": ("REGISTRY_MAX_OCI_MANIFEST_BYTES", 4 << 20),
}


#: the largest value a limit may be given (a read is bounded by it; 2**62
#: keeps ``limit + 1`` a machine integer everywhere it is used).
_MAX_SETTING = 1 << 62
_DIGITS = re.compile(r"[0-9]{1,19}")


def _env_bytes(name: str, default: int) -> int:
    """``$name`` as a whole number from 1 to 2**62, ``default`` when unset or
    empty.

    Raises:
        UsageError: any other value (``abc``, ``0``, ``-5``, ``1.5``, a
            non-ASCII digit, more than 2**62): an operator's typo in a bound
            on hostile input is refused, never silently replaced.
    """
    raw = os.environ.get(name, "")
    if raw == "":
        return default
    value = int(raw) if _DIGITS.fullmatch(raw) else 0
    if not 0 < value <= _MAX_SETTING:
        from registry.errors import UsageError

        raise UsageError(f"{name}={raw[:40]!r}: expected a whole number from 1 to 2**62 "
                         f"(the default is {default})")
    return value


def read_at_most(f: Any, limit: int) -> bytes:
    """Up to ``limit + 1`` bytes of the binary file ``f``, read in chunks of
    at most 1 MiB: memory follows what the file holds, not ``limit`` (one
    ``f.read(limit + 1)`` reserves the whole limit up front)."""
    parts: list[bytes] = []
    left = limit + 1
    while left > 0:
        block = f.read(min(left, 1 << 20))
        if not block:
            break
        parts.append(block)
        left -= len(block)
    return b"".join(parts)


def __getattr__(name: str) -> int:
    """``limits.MAX_<WHAT>``: the limit's variable now, else its default.

    Raises:
        AttributeError: no such limit.
    """
    try:
        env, default = _LIMITS[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    return _env_bytes(env, default)


def __dir__() -> list[str]:
    return sorted([*globals(), *_LIMITS])


_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')


def json_values_at_most(data: bytes) -> int:
    """An upper bound on the number of values in the JSON text ``data``,
    counted without parsing it: one more than the commas, brackets and braces
    outside strings. Linear, in C (two regex/bytes passes)."""
    bare = _JSON_STRING.sub(b'""', data)
    return 1 + bare.count(b",") + bare.count(b"[") + bare.count(b"{")


def read_local(path: str | os.PathLike[str], limit: int) -> bytes:
    """The bytes of the local file ``path``, at most ``limit`` of them (a pull
    record, a stamp, a placed manifest: another local user may have written it).

    Raises:
        OSError: the file cannot be read.
        DocumentError: it is longer than ``limit`` (a ``ValueError``).
    """
    from registry.errors import DocumentError

    with open(path, "rb") as f:
        data = read_at_most(f, limit)
    if len(data) > limit:
        raise DocumentError(os.fspath(path), f"larger than the {limit}-byte limit "
                                             "(registry.rules.limits)")
    return data

