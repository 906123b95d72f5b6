"""The JSON Schemas of schemas/ and the validators of registry.rules.schemas."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from registry.rules import schemas
from registry.errors import DocumentError, SchemaValidationError

PATH = "runs/r1/ckpt/step-000001/doc.json"
SHA = "0123456789abcdef" * 4
SCHEMA_NAMES = [
    "manifest", "trainer-state", "generation-config", "ledger-row", "eval-result", "linear-head",
    "cli-error", "cache-ls", "cache-prune", "cache-verify", "actor", "event", "alias-entry",
]
DELETE = object()


def checkpoint_manifest() -> dict[str, Any]:
    return {
        "format": "tinyllm-manifest", "format_version": 1, "kind": "checkpoint",
        "created_at": "2025-01-31T12:00:00Z", "run_id": "r1", "step": 1,
        "files": [{"path": "config.json", "size": 2, "sha256": SHA},
                  {"path": "model.safetensors", "size": 0, "sha256": SHA}],
    }


def release_manifest() -> dict[str, Any]:
    return {
        "format": "tinyllm-manifest", "format_version": 1, "kind": "release",
        "created_at": "2025-01-31T12:00:00.123Z", "model_id": "tiny-llm", "version": "1.0.0",
        "source": {"run_id": "r1", "step": 500, "manifest_sha256": SHA},
        "files": [{"path": "heads/sentiment.json", "size": 10, "sha256": SHA}],
        "layout": "tinyllm", "metadata": {"dtype": "bf16"},
    }


def trainer_state() -> dict[str, Any]:
    return {
        "step": 500, "tokens_seen": 1_024_000,
        "data_cursor": {"source": "fineweb", "shard": 3, "offset": 4096},
        "generator": {"algorithm": "pcg32", "state": "853c49e6748fea9b", "inc": "da3e39cb94b95bdb"},
        "learning_rate": 3e-4, "spec_sha256": SHA, "git_sha": "a" * 40,
    }


def generation_config() -> dict[str, Any]:
    return {
        "max_new_tokens": 128, "temperature": 0.7, "top_p": 1, "top_k": 0,
        "repetition_penalty": 1.1, "do_sample": True, "bos_token_id": 1, "pad_token_id": 0,
        "eos_token_id": [2, 3], "transformers_version": "4.46.0",
    }


def ledger_row() -> dict[str, Any]:
    return {
        "source_id": "fineweb-edu", "name": "FineWeb-Edu", "uri": "hf://datasets/fineweb-edu",
        "license": "ODC-By-1.0", "allowed_uses": ["train", "eval"], "revoked": False,
        "revoked_at": None, "revocation_reason": None,
    }


def revoked_row() -> dict[str, Any]:
    return {**ledger_row(), "source_id": "scrape-2", "revoked": True,
            "revoked_at": "2025-03-01T00:00:00Z", "revocation_reason": "takedown request"}


def eval_row() -> dict[str, Any]:
    return {"suite": "smoke", "task": "arc", "example_id": "arc-0001", "metric": "accuracy",
            "value": 1.0, "created_at": "2025-01-31T12:00:00Z"}


def eval_summary() -> dict[str, Any]:
    return {
        "suite": "smoke", "suite_version": "1.2", "created_at": "2025-01-31T12:00:00Z",
        "results": [
            {"task": "arc", "metric": "accuracy", "value": 0.5, "n": 100, "threshold": 0.5,
             "higher_is_better": True, "passed": True},
            {"task": "wiki", "metric": "perplexity", "value": 20.0, "n": 10, "threshold": 25,
             "higher_is_better": False, "passed": True},
        ],
        "passed": True,
    }


def linear_head() -> dict[str, Any]:
    return {"name": "sentiment", "input_dim": 3, "labels": ["neg", "pos"],
            "weight": [[0.1, -0.2, 0.3], [0, 1, -1]], "bias": [0.0, 0.5], "pooling": "mean"}


DOCS: dict[str, tuple[Callable[[], Any], str, str | None]] = {
    "checkpoint": (checkpoint_manifest, "manifest", None),
    "release": (release_manifest, "manifest", None),
    "trainer": (trainer_state, "trainer-state", None),
    "generation": (generation_config, "generation-config", None),
    "row": (ledger_row, "ledger-row", None),
    "ledger": (lambda: [ledger_row(), revoked_row()], "ledger-row", "ledger"),
    "eval_row": (eval_row, "eval-result", None),
    "summary": (eval_summary, "eval-result", "summary"),
    "head": (linear_head, "linear-head", None),
}


def mutated(doc: Any, where: tuple[str | int, ...], value: Any) -> Any:
    """A copy of doc with the value at where replaced (or deleted)."""
    doc = copy.deepcopy(doc)
    parent = doc
    for part in where[:-1]:
        parent = parent[part]
    if value is DELETE:
        del parent[where[-1]]
    else:
        parent[where[-1]] = value
    return doc


def assert_rejected(doc: Any, schema: str, defs: str | None, location: str) -> SchemaValidationError:
    with pytest.raises(SchemaValidationError) as info:
        schemas.validate(doc, schema, path=PATH, defs=defs)
    error = info.value
    assert error.path == PATH
    assert error.rule.startswith(f"{location}: "), error.rule
    assert str(error) == f"{PATH}: {error.rule}"
    assert "\n" not in str(error)
    return error


# -- the schema files ------------------------------------------------------------


@pytest.mark.parametrize("name", SCHEMA_NAMES)
def test_schema_files_are_valid_draft_2020_12(name: str) -> None:
    schema = schemas.load_schema(name)
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["$id"] == f"https://model-registry.dev/schemas/{name}.schema.json"
    assert schema["title"] and schema["description"]
    assert Path(str(schemas.schema_path(name))).name == f"{name}.schema.json"


def test_every_shipped_schema_is_known() -> None:
    directory = Path(str(schemas.schema_path("manifest"))).parent
    assert sorted(p.name for p in directory.glob("*.schema.json")) == sorted(
        f"{name}.schema.json" for name in SCHEMA_NAMES)


def test_unknown_schema_and_defs() -> None:
    with pytest.raises(FileNotFoundError, match="nope"):
        schemas.schema_path("nope")
    with pytest.raises(KeyError, match="summary"):
        schemas.validate({}, "manifest", path=PATH, defs="summary")


def test_load_schema_returns_a_copy() -> None:
    schemas.load_schema("manifest")["properties"]["format"] = {}
    assert schemas.load_schema("manifest")["properties"]["format"] == {"const": "tinyllm-manifest"}
    assert_rejected(mutated(checkpoint_manifest(), ("format",), "x"), "manifest", None, "format")


# -- valid documents -------------------------------------------------------------


@pytest.mark.parametrize("doc_name", DOCS)
def test_valid_documents_pass(doc_name: str) -> None:
    factory, schema, defs = DOCS[doc_name]
    schemas.validate(factory(), schema, path=PATH, defs=defs)


@pytest.mark.parametrize(("doc_name", "where", "value"), [
    ("release", ("source",), {"uri": "hf://org/model@abc"}),
    ("release", ("created_at",), "2024-02-29T23:59:59Z"),
    ("checkpoint", ("files",), []),
    ("checkpoint", ("run_id",), "A" + "b.c_d-" * 21),  # 127 characters after the first
    ("trainer", ("git_sha",), None),
    ("trainer", ("learning_rate",), 0),
    ("generation", ("eos_token_id",), 2),
    ("generation", ("top_p",), 0.95),
    ("row", ("allowed_uses",), []),
    ("head", ("pooling",), "last"),
])
def test_valid_variants_pass(doc_name: str, where: tuple[str | int, ...], value: Any) -> None:
    factory, schema, defs = DOCS[doc_name]
    schemas.validate(mutated(factory(), where, value), schema, path=PATH, defs=defs)


def test_generation_config_fields_are_optional() -> None:
    schemas.validate({}, "generation-config", path=PATH)


# -- invalid documents: every rule -------------------------------------------------

INVALID = [
    # manifest: common fields
    ("checkpoint", ("format",), "safetensors", "format"),
    ("checkpoint", ("format_version",), 2, "format_version"),
    ("checkpoint", ("kind",), "snapshot", "kind"),
    ("checkpoint", ("kind",), DELETE, "(root)"),
    ("checkpoint", ("created_at",), DELETE, "(root)"),
    ("checkpoint", ("created_at",), "2025-01-31T12:00:00+02:00", "created_at"),
    ("checkpoint", ("created_at",), "2025-01-31 12:00:00Z", "created_at"),
    ("checkpoint", ("created_at",), "2025-13-01T12:00:00Z", "created_at"),
    ("checkpoint", ("created_at",), "2025-01-31T12:00:60Z", "created_at"),
    ("checkpoint", ("files",), {}, "files"),
    ("checkpoint", ("files", 1, "sha256"), "A" * 64, "files[1].sha256"),
    ("checkpoint", ("files", 1, "sha256"), SHA[:-1], "files[1].sha256"),
    ("checkpoint", ("files", 1, "sha256"), DELETE, "files[1]"),
    ("checkpoint", ("files", 1, "size"), -1, "files[1].size"),
    ("checkpoint", ("files", 1, "size"), 1.5, "files[1].size"),
    ("checkpoint", ("files", 1, "size"), "10", "files[1].size"),
    ("checkpoint", ("files", 0, "path"), "", "files[0].path"),
    ("checkpoint", ("files", 0, "path"), DELETE, "files[0]"),
    ("checkpoint", ("files", 0, "mode"), "0644", "files[0]"),
    ("checkpoint", ("extra",), 1, "(root)"),
    ("checkpoint", ("layout",), 1, "layout"),
    ("checkpoint", ("metadata",), {"a b": 1}, 'metadata["a b"]'),
    # manifest: checkpoint kind
    ("checkpoint", ("run_id",), DELETE, "(root)"),
    ("checkpoint", ("step",), DELETE, "(root)"),
    ("checkpoint", ("step",), -1, "step"),
    ("checkpoint", ("run_id",), "", "run_id"),
    ("checkpoint", ("run_id",), "..", "run_id"),
    ("checkpoint", ("run_id",), "-r1", "run_id"),
    ("checkpoint", ("run_id",), "r/1", "run_id"),
    ("checkpoint", ("run_id",), "r" * 129, "run_id"),
    ("checkpoint", ("model_id",), "tiny-llm", "(root)"),
    ("checkpoint", ("source",), {"uri": "x"}, "(root)"),
    # manifest: release kind
    ("release", ("model_id",), DELETE, "(root)"),
    ("release", ("version",), DELETE, "(root)"),
    ("release", ("source",), DELETE, "(root)"),
    ("release", ("version",), "refs", "version"),
    ("release", ("model_id",), ".", "model_id"),
    ("release", ("step",), 1, "(root)"),
    ("release", ("source",), "hf://org/model", "source"),
    ("release", ("source", "manifest_sha256"), DELETE, "source"),
    ("release", ("source", "manifest_sha256"), "xyz", "source.manifest_sha256"),
    ("release", ("source", "step"), -5, "source.step"),
    ("release", ("source", "run_id"), "no spaces", "source.run_id"),
    ("release", ("source",), {"uri": "hf://x", "run_id": "r1"}, "source"),
    ("release", ("source",), {"uri": ""}, "source.uri"),
    # trainer state
    *[("trainer", (key,), DELETE, "(root)") for key in trainer_state()],
    ("trainer", ("extra",), 1, "(root)"),
    ("trainer", ("step",), -1, "step"),
    ("trainer", ("tokens_seen",), 1.5, "tokens_seen"),
    ("trainer", ("data_cursor", "source"), "", "data_cursor.source"),
    ("trainer", ("data_cursor", "shard"), -1, "data_cursor.shard"),
    ("trainer", ("data_cursor", "offset"), DELETE, "data_cursor"),
    ("trainer", ("data_cursor", "epoch"), 1, "data_cursor"),
    ("trainer", ("generator", "algorithm"), "mt19937", "generator.algorithm"),
    ("trainer", ("generator", "state"), "853c49e6748fea9", "generator.state"),
    ("trainer", ("generator", "inc"), "DA3E39CB94B95BDB", "generator.inc"),
    ("trainer", ("generator", "inc"), 42, "generator.inc"),
    ("trainer", ("learning_rate",), -1e-4, "learning_rate"),
    ("trainer", ("learning_rate",), "3e-4", "learning_rate"),
    ("trainer", ("spec_sha256",), None, "spec_sha256"),
    ("trainer", ("git_sha",), "a" * 39, "git_sha"),
    # generation config
    ("generation", ("max_new_tokens",), 0, "max_new_tokens"),
    ("generation", ("temperature",), -0.1, "temperature"),
    ("generation", ("top_p",), 0, "top_p"),
    ("generation", ("top_p",), 1.01, "top_p"),
    ("generation", ("top_k",), -1, "top_k"),
    ("generation", ("repetition_penalty",), 0, "repetition_penalty"),
    ("generation", ("do_sample",), "yes", "do_sample"),
    ("generation", ("bos_token_id",), -1, "bos_token_id"),
    ("generation", ("pad_token_id",), 1.5, "pad_token_id"),
    ("generation", ("eos_token_id",), [], "eos_token_id"),
    ("generation", ("eos_token_id",), "2", "eos_token_id"),
    # ledger row and ledger
    *[("row", (key,), DELETE, "(root)") for key in ledger_row()],
    ("row", ("extra",), 1, "(root)"),
    ("row", ("source_id",), "a b", "source_id"),
    ("row", ("name",), "", "name"),
    ("row", ("uri",), "", "uri"),
    ("row", ("license",), "", "license"),
    ("row", ("allowed_uses",), ["train", "sell"], "allowed_uses[1]"),
    ("row", ("allowed_uses",), ["train", "train"], "allowed_uses"),
    ("row", ("allowed_uses",), "train", "allowed_uses"),
    ("row", ("revoked",), "no", "revoked"),
    ("row", ("revoked_at",), "2025-03-01T00:00:00Z", "revoked_at"),
    ("row", ("revocation_reason",), "takedown", "revocation_reason"),
    ("ledger", (1, "revoked_at"), None, "[1].revoked_at"),
    ("ledger", (1, "revoked_at"), "yesterday", "[1].revoked_at"),
    ("ledger", (1, "revocation_reason"), 7, "[1].revocation_reason"),
    ("ledger", (0, "license"), DELETE, "[0]"),
    # eval result row and summary
    ("eval_row", ("example_id",), 1, "example_id"),
    ("eval_row", ("value",), "1.0", "value"),
    ("eval_row", ("created_at",), "2025-01-31", "created_at"),
    ("eval_row", ("suite",), DELETE, "(root)"),
    ("eval_row", ("extra",), 1, "(root)"),
    ("summary", ("results",), [], "results"),
    ("summary", ("suite_version",), "", "suite_version"),
    ("summary", ("created_at",), DELETE, "(root)"),
    ("summary", ("passed",), "true", "passed"),
    ("summary", ("extra",), 1, "(root)"),
    ("summary", ("results", 1, "n"), 0, "results[1].n"),
    ("summary", ("results", 1, "value"), None, "results[1].value"),
    ("summary", ("results", 1, "threshold"), DELETE, "results[1]"),
    ("summary", ("results", 0, "higher_is_better"), "yes", "results[0].higher_is_better"),
    ("summary", ("results", 0, "stderr"), 0.1, "results[0]"),
    # linear head
    *[("head", (key,), DELETE, "(root)") for key in linear_head()],
    ("head", ("extra",), 1, "(root)"),
    ("head", ("name",), "my head", "name"),
    ("head", ("input_dim",), 0, "input_dim"),
    ("head", ("labels",), [], "labels"),
    ("head", ("labels",), ["pos", "pos"], "labels"),
    ("head", ("labels",), ["pos", 1], "labels[1]"),
    ("head", ("weight",), [[0.1, "x", 0.3], [0, 1, -1]], "weight[0][1]"),
    ("head", ("weight",), [[0.1, 0.2, 0.3], 7], "weight[1]"),
    ("head", ("bias",), [0.0, None], "bias[1]"),
    ("head", ("pooling",), "max", "pooling"),
]


@pytest.mark.parametrize(("doc_name", "where", "value", "location"), INVALID)
def test_invalid_documents_fail_naming_path_and_location(
        doc_name: str, where: tuple[str | int, ...], value: Any, location: str) -> None:
    factory, schema, defs = DOCS[doc_name]
    assert_rejected(mutated(factory(), where, value), schema, defs, location)


@pytest.mark.parametrize(("doc_name", "document"), [
    ("checkpoint", []), ("trainer", "x"), ("generation", [1]), ("ledger", {}), ("summary", None),
    ("head", 1),
])
def test_wrong_root_type(doc_name: str, document: Any) -> None:
    _, schema, defs = DOCS[doc_name]
    assert_rejected(document, schema, defs, "(root)")


def test_dates_are_checked_as_dates() -> None:
    pytest.importorskip("rfc3339_validator")  # jsonschema's "date-time" format checker
    doc = mutated(checkpoint_manifest(), ("created_at",), "2025-02-30T12:00:00Z")
    assert "is not a 'date-time'" in assert_rejected(doc, "manifest", None, "created_at").rule


def test_messages_name_the_rule() -> None:
    error = assert_rejected(mutated(checkpoint_manifest(), ("files", 1, "sha256"), "ab"),
                            "manifest", None, "files[1].sha256")
    assert "'ab' does not match" in error.rule
    error = assert_rejected(mutated(checkpoint_manifest(), ("model_id",), "m"),
                            "manifest", None, "(root)")
    assert "'model_id' is not one of" in error.rule
    error = assert_rejected(mutated(release_manifest(), ("source", "manifest_sha256"), DELETE),
                            "manifest", None, "source")
    assert "'manifest_sha256' is a required property" in error.rule


def test_long_messages_are_shortened() -> None:
    error = assert_rejected(list(range(10_000)), "manifest", None, "(root)")
    assert len(error.rule) < 400 and error.rule.endswith("...")


# -- ledger ------------------------------------------------------------------------


def test_ledger_source_ids_are_unique() -> None:
    rows = [ledger_row(), revoked_row(), {**ledger_row(), "name": "again"}]
    with pytest.raises(SchemaValidationError) as info:
        schemas.validate_ledger(rows, path=PATH)
    assert info.value.path == PATH
    assert info.value.rule == "[2].source_id: 'fineweb-edu' already appears at [0]"
    schemas.validate_ledger(rows[:2], path=PATH)
    schemas.validate_ledger([], path=PATH)


def test_ledger_rows_are_schema_checked() -> None:
    with pytest.raises(SchemaValidationError, match=r"\[1\]\.allowed_uses\[0\]"):
        schemas.validate_ledger([ledger_row(), {**revoked_row(), "allowed_uses": ["sell"]}],
                                path=PATH)


# -- eval summary ------------------------------------------------------------------


@pytest.mark.parametrize(("index", "value", "passed", "rule"), [
    (0, 0.49, True, "results[0].passed is true, but value 0.49 >= threshold 0.5 is false"),
    (0, 0.51, False, "results[0].passed is false, but value 0.51 >= threshold 0.5 is true"),
    (1, 25.5, True, "results[1].passed is true, but value 25.5 <= threshold 25 is false"),
    (1, 25, False, "results[1].passed is false, but value 25 <= threshold 25 is true"),
])
def test_eval_result_passed_must_match_threshold(
        index: int, value: float, passed: bool, rule: str) -> None:
    doc = mutated(mutated(eval_summary(), ("results", index, "value"), value),
                  ("results", index, "passed"), passed)
    doc["passed"] = all(result["passed"] for result in doc["results"])
    with pytest.raises(SchemaValidationError) as info:
        schemas.validate_eval_summary(doc, path=PATH)
    assert (info.value.path, info.value.rule) == (PATH, rule)


def test_eval_summary_passed_iff_every_result_passed() -> None:
    schemas.validate_eval_summary(eval_summary(), path=PATH)
    with pytest.raises(SchemaValidationError) as info:
        schemas.validate_eval_summary(mutated(eval_summary(), ("passed",), False), path=PATH)
    assert info.value.rule == "passed is false, but every result passed"

    failing = mutated(mutated(eval_summary(), ("results", 1, "value"), 30.0),
                      ("results", 1, "passed"), False)
    with pytest.raises(SchemaValidationError) as info:
        schemas.validate_eval_summary(failing, path=PATH)
    assert info.value.rule == "passed is true, but results[1] failed"
    schemas.validate_eval_summary(mutated(failing, ("passed",), False), path=PATH)


def test_eval_summary_is_schema_checked_first() -> None:
    with pytest.raises(SchemaValidationError, match=r"results\[0\]: 'passed' is a required"):
        schemas.validate_eval_summary(mutated(eval_summary(), ("results", 0, "passed"), DELETE),
                                      path=PATH)


# -- linear head -------------------------------------------------------------------


def test_linear_head_shapes_pass() -> None:
    schemas.validate_linear_head(linear_head(), path=PATH, hidden_size=3)


@pytest.mark.parametrize(("where", "value", "hidden_size", "rule"), [
    ((), None, 768, "input_dim 3 differs from the model's hidden size 768"),
    (("weight",), [[0.1, 0.2, 0.3]], 3, "weight has 1 rows, expected one per label (2)"),
    (("weight",), [[0.1, 0.2, 0.3], [1, 2]], 3, "weight[1] has 2 columns, expected input_dim 3"),
    (("weight",), [[0.1, 0.2, 0.3, 0.4], [1, 2, 3]], 3,
     "weight[0] has 4 columns, expected input_dim 3"),
    (("bias",), [0.0], 3, "bias has 1 entries, expected one per label (2)"),
    (("bias",), [0.0, 0.1, 0.2], 3, "bias has 3 entries, expected one per label (2)"),
])
def test_linear_head_wrong_shapes(
        where: tuple[str, ...], value: Any, hidden_size: int, rule: str) -> None:
    doc = mutated(linear_head(), where, value) if where else linear_head()
    with pytest.raises(SchemaValidationError) as info:
        schemas.validate_linear_head(doc, path=PATH, hidden_size=hidden_size)
    assert (info.value.path, info.value.rule) == (PATH, rule)


def test_linear_head_is_schema_checked_first() -> None:
    with pytest.raises(SchemaValidationError, match=r"pooling: 'max' is not one of"):
        schemas.validate_linear_head(mutated(linear_head(), ("pooling",), "max"),
                                     path=PATH, hidden_size=3)


# -- load_json ---------------------------------------------------------------------


def test_load_json_parses_documents() -> None:
    data = json.dumps(trainer_state()).encode()
    assert schemas.load_json(data, path=PATH) == trainer_state()
    assert schemas.load_json('{"name": "café"}'.encode(), path=PATH) == {"name": "café"}


@pytest.mark.parametrize(("data", "rule"), [
    (b'{"a": "\xff"}', "not valid UTF-8"),
    ('{"a": "é"}'.encode("latin-1"), "not valid UTF-8"),
    (b'{"a": 1,\n "b": }', "not valid JSON: Expecting value at line 2 column 7"),
    (b"", "not valid JSON: Expecting value at line 1 column 1"),
    (b'{"a": 1} x', "not valid JSON: Extra data at line 1 column 10"),
    (b'\xef\xbb\xbf{"a": 1}', "not valid JSON: Unexpected UTF-8 BOM (decode using utf-8-sig) "
                              "at line 1 column 1"),
    (b'{"step": 1, "step": 2}', 'not valid JSON: duplicate object key "step"'),
    (b'{"a": [{"k": 1, "k": 1}]}', 'not valid JSON: duplicate object key "k"'),
    (b'{"learning_rate": NaN}', "not valid JSON: NaN is not allowed"),
    (b'[Infinity]', "not valid JSON: Infinity is not allowed"),
    (b'[-Infinity]', "not valid JSON: -Infinity is not allowed"),
])
def test_load_json_rejects(data: bytes, rule: str) -> None:
    with pytest.raises(DocumentError) as info:
        schemas.load_json(data, path=PATH)
    assert (info.value.path, info.value.rule) == (PATH, rule)
    assert str(info.value) == f"{PATH}: {rule}"


def test_load_json_rejects_hostile_input_as_document_error() -> None:
    with pytest.raises(DocumentError, match=r"^runs/r1/.*: not valid JSON: "):
        schemas.load_json(b"[" * 100_000 + b"]" * 100_000, path=PATH)
    # refused by its length, never converted (registry.rules.numbers)
    with pytest.raises(DocumentError, match=r"^runs/r1/.*: \(root\): an integer of 5000 digits"):
        schemas.load_json(b"1" * 5000, path=PATH)
