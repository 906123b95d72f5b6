"""Optimizer state in ``optimizer.safetensors``: the names, shapes and dtype rules
(DESIGN section 4; seed 000, "per parameter <name>"). Also importable from
:mod:`registry.formats.safetensors_io`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from registry.errors import SafetensorsError
from registry.formats.safetensors_format import SafetensorsHeader, _describe


_OPTIMIZER_STATES = {
    "adamw": ("exp_avg", "exp_avg_sq"),
    "sgd": ("momentum_buffer",),
    "muon": ("momentum_buffer",),
}


def check_optimizer_state(optimizer_state: SafetensorsHeader | Mapping[str, Any],
                          model_shapes: Mapping[str, Sequence[int]], *,
                          optimizer: str, path: str) -> None:
    """Check ``optimizer.safetensors`` against the model (DESIGN section 4).

    Every optimizer tensor must be named ``<param>.exp_avg`` or
    ``<param>.exp_avg_sq`` (adamw) or ``<param>.momentum_buffer`` (sgd, muon),
    where ``<param>`` is a model parameter; it must have that parameter's shape
    and be F32. The state must be complete (seed 000, "per parameter
    <name>"): AdamW has both ``exp_avg`` and ``exp_avg_sq`` for every
    parameter; SGD and Muon have ``momentum_buffer`` for every parameter, or
    (momentum not used) for none. Metadata is not checked here.

    Args:
        optimizer_state: the header of ``optimizer.safetensors`` (checked without
            reading tensor data) or name -> tensor (as for :func:`write_safetensors`).
        model_shapes: parameter name -> shape, e.g. ``read_header(model).shapes``.
        optimizer: ``"adamw"``, ``"sgd"`` or ``"muon"``.
        path: names the optimizer file in error messages.

    Raises:
        SafetensorsError: for an unknown optimizer, or for the first tensor (in
            name order) that breaks a rule; the rule names the tensor.
    """
    states = _OPTIMIZER_STATES.get(optimizer)
    if states is None:
        raise SafetensorsError(path, f"unknown optimizer {optimizer!r}, expected one of "
                                     f"{sorted(_OPTIMIZER_STATES)}")
    if isinstance(optimizer_state, SafetensorsHeader):
        described = {name: (info.dtype, info.shape)
                     for name, info in optimizer_state.tensors.items()}
    else:
        described = {name: _describe(tensor, name, path)
                     for name, tensor in optimizer_state.items()}
    for name in sorted(described):
        dtype, shape = described[name]
        param, _, suffix = name.rpartition(".")
        if not param or suffix not in states:
            expected = " or ".join(f"'<param>.{state}'" for state in states)
            raise SafetensorsError(path, f"optimizer tensor {name!r}: name must be "
                                         f"{expected} for {optimizer}")
        if param not in model_shapes:
            raise SafetensorsError(path, f"optimizer tensor {name!r}: the model has no "
                                         f"parameter {param!r}")
        if tuple(shape) != tuple(model_shapes[param]):
            raise SafetensorsError(path, f"optimizer tensor {name!r}: shape {list(shape)} "
                                         f"differs from parameter {param!r} shape "
                                         f"{list(model_shapes[param])}")
        if dtype != "F32":
            raise SafetensorsError(path, f"optimizer tensor {name!r}: dtype {dtype}, "
                                         "optimizer state must be F32")
    _check_complete(set(described), model_shapes, states, optimizer=optimizer, path=path)


def _check_complete(names: set[str], model_shapes: Mapping[str, Sequence[int]],
                    states: tuple[str, ...], *, optimizer: str, path: str) -> None:
    """Every parameter has every state tensor of ``optimizer`` (SGD/Muon: or
    no parameter has any: momentum not used)."""
    if optimizer in ("sgd", "muon") and not names:
        return
    for param in sorted(model_shapes):
        missing = [f"{param}.{state}" for state in states if f"{param}.{state}" not in names]
        if missing:
            have = f"{len(names)} optimizer tensors" if names else "no optimizer tensor"
            raise SafetensorsError(path, f"optimizer state incomplete: {missing[0]!r} is "
                                         f"missing ({optimizer} keeps "
                                         f"{' and '.join(states)} for every parameter; "
                                         f"the file has {have})")
