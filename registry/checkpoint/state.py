"""Validating and snapshotting what a training job hands to a checkpoint save.

Everything here runs synchronously inside ``save()``, so bad input is refused
before anything is written and the caller's arrays may change right after.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from registry.rules import schemas
from registry.errors import CheckpointError
from registry.formats.safetensors_io import check_optimizer_state

OPTIMIZERS = ("adamw", "sgd", "muon")


def to_numpy(tensor: Any) -> np.ndarray:
    """A numpy view of a numpy array, array-like, or torch tensor (torch is
    never imported here: it is recognized by its module)."""
    if type(tensor).__module__.startswith("torch"):
        tensor = tensor.detach().cpu()
        if str(tensor.dtype) == "torch.bfloat16":
            tensor = tensor.float()
        tensor = tensor.numpy()
    return np.asarray(tensor)


def snapshot_f32(tensors: Mapping[str, Any], *, what: str, copy: bool,
                 reuse: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """F32, C-contiguous copies (or views when ``copy`` is False and no cast is
    needed) of floating-point tensors.

    Args:
        reuse: arrays of an earlier snapshot that nobody reads any more; one of
            the same name and shape is overwritten in place instead of
            allocating (no page faults: an async save then blocks the caller
            for about one memcpy of the state).

    Raises:
        CheckpointError: a tensor is not floating point, or a name is empty.
    """
    out = {}
    for name, t in tensors.items():
        if not isinstance(name, str) or not name:
            raise CheckpointError(f"{what}: tensor name {name!r} must be a non-empty string")
        a = to_numpy(t)
        if not np.issubdtype(a.dtype, np.floating) and a.dtype.name != "bfloat16":
            raise CheckpointError(f"{what}: tensor {name!r} has dtype {a.dtype}, "
                                  "expected floating point (saved as F32)")
        buf = (reuse or {}).get(name)
        if copy and buf is not None and buf.shape == a.shape:
            np.copyto(buf, a, casting="unsafe")
            out[name] = buf
        else:
            out[name] = np.array(a, dtype=np.float32, order="C", copy=copy or None)
    return out


def encode_json(doc: Any, *, what: str) -> bytes:
    """``doc`` as UTF-8 JSON; bytes/str are taken verbatim after a parse check."""
    if isinstance(doc, (bytes, bytearray)):
        data = bytes(doc)
    elif isinstance(doc, str):
        data = doc.encode()
    else:
        try:
            return (json.dumps(doc, indent=2, ensure_ascii=False, allow_nan=False)
                    + "\n").encode()
        except (TypeError, ValueError) as e:
            raise CheckpointError(f"{what}: not JSON-serializable: {e}") from None
    schemas.load_json(data, path=what)
    return data


def read_file_or_doc(value: Any, *, what: str) -> bytes:
    """tokenizer input: a path to a file, JSON text/bytes, or a JSON object."""
    if isinstance(value, os.PathLike):
        with open(value, "rb") as f:
            return encode_json(f.read(), what=what)
    return encode_json(value, what=what)


def config_dict(config_bytes: bytes, *, what: str) -> dict[str, Any]:
    doc = schemas.load_json(config_bytes, path=what)
    if not isinstance(doc, dict):
        raise CheckpointError(f"{what}: must be a JSON object")
    return doc


def validate_save_inputs(step: int, model: Mapping[str, np.ndarray],
                         optimizer_state: Mapping[str, np.ndarray], *, optimizer: str,
                         config: dict[str, Any], trainer_state: Any, has_tokenizer: bool,
                         generation_config: Any, where: str) -> None:
    """Every rule of a checkpoint save (seed 000 "Checkpoint step directory").

    Raises:
        CheckpointError: bad step, optimizer name, or missing tokenizer.
        SchemaValidationError: trainer state or generation config breaks its schema.
        SafetensorsError: an optimizer tensor names no parameter or has its shape wrong.
    """
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise CheckpointError(f"{where}: step {step!r} must be a non-negative integer")
    if optimizer not in OPTIMIZERS:
        raise CheckpointError(f"{where}: optimizer {optimizer!r} is not one of "
                              f"{', '.join(OPTIMIZERS)}")
    if not model:
        raise CheckpointError(f"{where}/model.safetensors: no parameters")
    if config.get("tl_tokenizer") == "file" and not has_tokenizer:
        raise CheckpointError(f"{where}/config.json: says \"tl_tokenizer\": \"file\" but no "
                              "tokenizer was given (tokenizer.json is required)")
    schemas.validate(trainer_state, "trainer-state", path=f"{where}/trainer_state.json")
    if trainer_state["step"] != step:
        raise CheckpointError(f"{where}/trainer_state.json: step {trainer_state['step']} "
                              f"differs from the saved step {step}")
    if generation_config is not None:
        schemas.validate(generation_config, "generation-config",
                         path=f"{where}/generation_config.json")
    check_optimizer_state(optimizer_state, {k: v.shape for k, v in model.items()},
                          optimizer=optimizer, path=f"{where}/optimizer.safetensors")
