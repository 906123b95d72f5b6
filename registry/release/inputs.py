"""The documents a release takes and keeps: ``ledger.json``, ``evals/summary.json``,
heads and configs given inline or as files, loaded and validated before any gate
runs; read back from a committed release for its gates (split from
:mod:`registry.release.model_release`).

Errors: DocumentError naming the file and the rule; IntegrityError when bytes
read from a checkpoint are not the ones its manifest lists; UsageError for a
run id that is not the step's.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping
from typing import Any

from registry.rules import limits, numbers, schemas
from registry.errors import DocumentError, IntegrityError, RegistryError, UsageError
from registry.gating.gates import GateResult
from registry.protocol.layout import release_prefix
from registry.protocol.manifest import Manifest
from registry.release import code as release_code
from registry.release import policy
from registry.store import Store, join
from registry.protocol.verify import read_manifest


def load_doc(value: Any, *, what: str) -> tuple[Any, str]:
    """A JSON document given inline or as a file path: ``(document, where)``.

    Raises:
        DocumentError: the file is missing, not UTF-8 or not JSON.
    """
    if isinstance(value, StoredDoc):
        return schemas.load_json(value.data, path=value.where), value.where
    if isinstance(value, (str, os.PathLike)):
        try:
            with open(value, "rb") as f:
                data = f.read()
        except OSError as e:
            raise DocumentError(str(value), f"cannot read {what}: {e.strerror}") from None
        return schemas.load_json(data, path=str(value)), str(value)
    return numbers.plain_copy(value, path=what), what


def dump_doc(doc: Any) -> bytes:
    """A document as a release stores it: JSON, indented, UTF-8, one final newline."""
    return (numbers.dumps(doc, indent=2, ensure_ascii=False) + "\n").encode()


def stored_code(store: Store, model_id: str, version: str) -> dict[str, Any]:
    """:func:`registry.release.code.code_files` of a committed release (its
    manifest's paths; config.json and tokenizer_config.json read bounded)."""
    prefix = release_prefix(model_id, version)
    manifest = read_manifest(store, prefix)
    return release_code.code_files(
        [e.path for e in manifest.files],
        lambda n: store.read_bytes(join(prefix, n), limit=limits.MAX_JSON_BYTES))


def stored_code_gate(store: Store, model_id: str, version: str) -> list[GateResult]:
    """The ``code`` gate of a committed release when its policy forbids code, else []."""
    if not policy.forbids_code(store, model_id):
        return []
    return [release_code.gate_code(stored_code(store, model_id, version))]


def release_inputs(ledger: Any, eval_summary: Any) -> tuple[Any, Any]:
    """The ledger and eval summary given to a new release, loaded and validated
    *before* any gate runs or any weight is read: a file that is missing,
    unreadable, not JSON or breaks its schema is the caller's input error
    (DocumentError naming the file and the rule), not a failing gate. ``None``
    stays None (the gate then says the document is missing)."""
    docs = []
    for value, what, validate in ((ledger, "ledger.json", schemas.validate_ledger),
                                  (eval_summary, "evals/summary.json",
                                   schemas.validate_eval_summary)):
        if value is None:
            docs.append(None)
            continue
        doc, where = load_doc(value, what=what)
        validate(doc, path=where)
        docs.append(doc)
    return docs[0], docs[1]


def validated_doc(value: Any, what: str,
               validate: Callable[..., None]) -> tuple[Any, str | None]:
    """``(document, None)`` when ``value`` loads and validates, else ``(None, why)``."""
    if value is None:
        return None, f"{what} is missing"
    try:
        doc, where = load_doc(value, what=what)
        validate(doc, path=where)
    except RegistryError as e:
        return None, str(e)
    return doc, None


class StoredDoc:
    """Raw bytes of a document read from a release, with where they came from."""

    def __init__(self, data: bytes, where: str) -> None:
        self.data = data
        self.where = where


def stored_doc(data: bytes | None, prefix: str, name: str, store: Store) -> StoredDoc | None:
    return None if data is None else StoredDoc(data, store.url_of(join(prefix, name)))


def config_dtype(config: Mapping[str, Any]) -> str | None:
    value = config.get("dtype", config.get("torch_dtype"))
    return value if isinstance(value, str) else None


def check_source_bytes(data: bytes, digests: Mapping[str, str] | None, relpath: str,
                        where: str) -> None:
    """Bytes read from a checkpoint to derive a file from must be the ones its
    manifest lists (IntegrityError otherwise; nothing is committed)."""
    expected = (digests or {}).get(relpath)
    actual = hashlib.sha256(data).hexdigest()
    if expected is not None and actual != expected:
        raise IntegrityError(where, expected_sha256=expected, actual_sha256=actual,
                             actual_size=len(data),
                             reason=f"the bytes read differ from the source manifest (sha256 "
                                    f"{actual}, expected {expected}); nothing was committed")


def source_run_id(run_id: str | None, manifest: Manifest, where: str) -> str:
    """The release's ``source.run_id``: the one the step's manifest records, so
    that a release and the checkpoint it came from name the same run."""
    recorded = manifest.meta.get("run_id")
    if not isinstance(recorded, str):
        return run_id or ""
    if run_id is not None and run_id != recorded:
        raise UsageError(f"{where}/MANIFEST.json: records run_id {recorded!r}, not "
                         f"{run_id!r}; name that run (or none)")
    return recorded


def check_carried_generation_config(data: bytes, where: str) -> None:
    """A source's own ``generation_config.json``, carried into the release, is
    held to the rule a given one is (``generation-config.schema.json``).

    Raises:
        DocumentError: not UTF-8 JSON, or it breaks the schema (naming ``where``).
    """
    schemas.validate(schemas.load_json(data, path=where), "generation-config", path=where)
