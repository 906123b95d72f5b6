"""Loading and validating the JSON Schemas of ``schemas/`` (DESIGN section 4).

The schemas are found through :mod:`importlib.resources`: in an installed wheel they
are package data under ``registry/_resources/schemas``; in a source checkout (or an
editable install) they are the repo root's ``schemas/`` next to the package.

Every failure is a :class:`~registry.errors.DocumentError` (or its subclass
:class:`~registry.errors.SchemaValidationError`) whose message is one line naming
the file the document came from, the JSON location, and the rule that was broken.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from registry.rules import limits, numbers
from registry.errors import DocumentError, SchemaValidationError
from registry.host.resources import resource_dir

if TYPE_CHECKING:  # importlib.resources loads on the first schema read, not with this module
    from importlib.resources.abc import Traversable

__all__ = [
    "load_json",
    "load_local_json",
    "load_schema",
    "schema_path",
    "validate",
    "validate_eval_summary",
    "validate_ledger",
    "validate_linear_head",
]

_MAX_RULE = 300  # characters of a jsonschema message kept (they can quote a whole document)
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _schema_dir() -> Traversable:
    return resource_dir("schemas")


def schema_path(name: str) -> Traversable:
    """Return the schema file ``<name>.schema.json``.

    Args:
        name: the schema's name without suffix, e.g. ``"manifest"``.

    Returns:
        The file, from the package data of an installed wheel, else from the repo
        root's ``schemas/`` directory.

    Raises:
        FileNotFoundError: no schema of that name is shipped.
    """
    path = _schema_dir() / f"{name}.schema.json"
    if not path.is_file():
        raise FileNotFoundError(f"no JSON Schema named {name!r} ({path})")
    return path


@functools.cache
def _schema(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(schema_path(name).read_text(encoding="utf-8"))
    return loaded


def load_schema(name: str) -> dict[str, Any]:
    """Return the parsed schema ``<name>.schema.json`` (a copy of the cached one).

    Args:
        name: the schema's name without suffix, e.g. ``"manifest"``.

    Returns:
        The schema document.

    Raises:
        FileNotFoundError: no schema of that name is shipped.
    """
    return copy.deepcopy(_schema(name))


@functools.cache
def _validator(name: str, defs: str | None) -> Any:
    from jsonschema import Draft202012Validator  # loaded by the first validation
    from referencing import Registry, Resource

    schema = _schema(name)
    if defs is not None and defs not in schema.get("$defs", {}):
        raise KeyError(f"schema {name!r} has no $defs/{defs}")
    uri = schema["$id"] if defs is None else f"{schema['$id']}#/$defs/{defs}"
    registry: Registry[Any] = Registry().with_resource(schema["$id"], Resource.from_contents(schema))
    return Draft202012Validator(
        {"$ref": uri}, registry=registry, format_checker=Draft202012Validator.FORMAT_CHECKER
    )


def _location(parts: Iterable[str | int]) -> str:
    text = ""
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        elif _IDENTIFIER.fullmatch(part):
            text += f".{part}" if text else part
        else:
            text += f"[{json.dumps(part)}]"
    return text or "(root)"


def validate(document: Any, schema: str, *, path: str, defs: str | None = None) -> None:
    """Validate a parsed JSON document against a schema (draft 2020-12, with formats).

    Args:
        document: the parsed JSON value.
        schema: the schema's name, e.g. ``"manifest"``.
        path: the file or object key the document came from; it starts the message.
        defs: validate against ``$defs/<defs>`` of the schema instead of its root
            (``$ref`` inside the schema still resolve).

    Raises:
        SchemaValidationError: the document breaks the schema; ``rule`` is one line,
            ``<location>: <rule>`` (e.g. ``files[3].sha256: 'ab' does not match ...``)
            for the most relevant error.
        FileNotFoundError: no schema of that name is shipped.
        KeyError: the schema has no ``$defs/<defs>``.
    """
    from jsonschema.exceptions import best_match

    error = best_match(_validator(schema, defs).iter_errors(document))
    if error is None:
        return
    message = " ".join(error.message.split())
    if len(message) > _MAX_RULE:
        message = message[: _MAX_RULE - 3] + "..."
    raise SchemaValidationError(path, f"{_location(error.absolute_path)}: {message}")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate object key {json.dumps(key)}")
        result[key] = value
    return result


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")


def load_json(data: bytes, *, path: str, max_values: int | None = None) -> Any:
    """Parse strict UTF-8 JSON: no NaN/Infinity constants, no duplicate object keys,
    at most ``max_values`` values.

    Args:
        data: the raw bytes of the file.
        path: the file or object key the bytes came from; it starts the message.
        max_values: the most values (objects, arrays, strings, numbers) the
            document may hold, counted before it is parsed (default
            :data:`registry.rules.limits.MAX_JSON_VALUES`): what a hostile document
            costs in memory is bounded by a count, not only by its bytes.

    Returns:
        The parsed value (dict, list, str, int, float, bool or None).

    Raises:
        DocumentError: ``"not valid UTF-8"``; or ``"not valid JSON: <msg> at line L
            column C"`` for a syntax error (a UTF-8 byte order mark included); or
            ``"not valid JSON: <rule>"`` for a duplicate key, a ``NaN``/``Infinity``
            constant, or nesting too deep; or ``"<field>: <number> is not a finite
            64-bit number"`` for a float that overflows binary64 (``1e400``) or an
            integer outside the index's 64-bit range (:mod:`registry.rules.numbers`); or
            ``"more than N JSON values"`` over ``max_values``.
    """
    cap = limits.MAX_JSON_VALUES if max_values is None else max_values
    if limits.json_values_at_most(data) > cap:
        raise DocumentError(path, f"more than {cap} JSON values (REGISTRY_MAX_JSON_VALUES)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise DocumentError(path, "not valid UTF-8") from None
    try:
        doc = json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_reject_constant,
                         parse_float=numbers.parse_float, parse_int=numbers.parse_int)
    except json.JSONDecodeError as exc:
        raise DocumentError(
            path, f"not valid JSON: {exc.msg.removesuffix(' at')} at line {exc.lineno} "
                  f"column {exc.colno}"
        ) from None
    except (ValueError, RecursionError) as exc:
        raise DocumentError(path, f"not valid JSON: {exc}") from None
    numbers.check_numbers(doc, path=path)
    return doc


def load_local_json(path: str | os.PathLike[str], limit: int | None = None) -> object:
    """:func:`registry.rules.limits.read_local` parsed as strict JSON (``registry.rules.schemas.load_json``),
    at most ``limit`` bytes (default :data:`registry.rules.limits.MAX_RECORD_BYTES`).

    Raises:
        OSError: unreadable.
        DocumentError: too long, not UTF-8 JSON, too deeply nested, a bad number.
    """
    cap = limits.MAX_RECORD_BYTES if limit is None else limit
    return load_json(limits.read_local(path, cap), path=os.fspath(path))


def validate_ledger(rows: Any, *, path: str) -> None:
    """Validate ``ledger.json``: an array of ledger rows with unique ``source_id``.

    Args:
        rows: the parsed document.
        path: the file or object key the document came from.

    Raises:
        SchemaValidationError: a row breaks ``ledger-row.schema.json`` (``$defs/ledger``),
            or two rows share a ``source_id``.
    """
    validate(rows, "ledger-row", path=path, defs="ledger")
    first: dict[str, int] = {}
    for index, row in enumerate(rows):
        source_id = row["source_id"]
        if source_id in first:
            raise SchemaValidationError(
                path, f"[{index}].source_id: {source_id!r} already appears at [{first[source_id]}]"
            )
        first[source_id] = index


def validate_eval_summary(doc: Any, *, path: str) -> None:
    """Validate ``evals/summary.json`` and the consistency of its ``passed`` flags.

    Each result passes iff ``value >= threshold`` (``higher_is_better``) or
    ``value <= threshold`` (otherwise); the summary passes iff every result passed.

    Args:
        doc: the parsed document.
        path: the file or object key the document came from.

    Raises:
        SchemaValidationError: the document breaks ``eval-result.schema.json``
            (``$defs/summary``), a result's ``passed`` disagrees with its value and
            threshold, or the summary's ``passed`` disagrees with its results.
    """
    validate(doc, "eval-result", path=path, defs="summary")
    for index, result in enumerate(doc["results"]):
        value, threshold = result["value"], result["threshold"]
        if result["higher_is_better"]:
            expected, op = value >= threshold, ">="
        else:
            expected, op = value <= threshold, "<="
        if result["passed"] != expected:
            raise SchemaValidationError(
                path,
                f"results[{index}].passed is {json.dumps(result['passed'])}, but value {value} "
                f"{op} threshold {threshold} is {json.dumps(expected)}",
            )
    failed = [index for index, result in enumerate(doc["results"]) if not result["passed"]]
    if doc["passed"] and failed:
        raise SchemaValidationError(path, f"passed is true, but results[{failed[0]}] failed")
    if not doc["passed"] and not failed:
        raise SchemaValidationError(path, "passed is false, but every result passed")


def validate_linear_head(doc: Any, *, path: str, hidden_size: int) -> None:
    """Validate ``heads/<name>.json`` and its shapes against the model it belongs to.

    Args:
        doc: the parsed document.
        path: the file or object key the document came from.
        hidden_size: the model's hidden size, which ``input_dim`` must equal.

    Raises:
        SchemaValidationError: the document breaks ``linear-head.schema.json``, or
            ``input_dim`` differs from ``hidden_size``, or ``weight`` is not
            ``[len(labels)][input_dim]``, or ``bias`` is not ``[len(labels)]``.
    """
    validate(doc, "linear-head", path=path)
    input_dim, labels, weight, bias = doc["input_dim"], doc["labels"], doc["weight"], doc["bias"]
    if input_dim != hidden_size:
        raise SchemaValidationError(
            path, f"input_dim {input_dim} differs from the model's hidden size {hidden_size}"
        )
    if len(weight) != len(labels):
        raise SchemaValidationError(
            path, f"weight has {len(weight)} rows, expected one per label ({len(labels)})"
        )
    for index, row in enumerate(weight):
        if len(row) != input_dim:
            raise SchemaValidationError(
                path, f"weight[{index}] has {len(row)} columns, expected input_dim {input_dim}"
            )
    if len(bias) != len(labels):
        raise SchemaValidationError(
            path, f"bias has {len(bias)} entries, expected one per label ({len(labels)})"
        )
