"""Code inside a release: what runs when an engine loads it, made visible and gateable.

Two kinds of file make a loader run code from the model directory:

* **pickles** -- ``*.bin``, ``*.pt``, ``*.pth``, ``*.pkl``, ``*.pickle``,
  ``*.ckpt``, ``*.joblib``, ``*.dill``, ``*.npy``/``*.npz`` (numpy loads
  pickled objects in them with ``allow_pickle``), ``*.h5``/``*.keras``
  (Lambda layers hold marshalled code): ``torch.load`` without
  ``weights_only`` runs any pickle;
* **remote code** -- ``*.py`` files, and ``auto_map`` in ``config.json`` or
  ``tokenizer_config.json`` (transformers imports the named modules with
  ``trust_remote_code=True``).

:func:`code_files` names them from a manifest's paths and those two JSON
files; :func:`gate_code` is the ``code`` gate a model's policy turns on
(``policy.json`` ``"forbid_code": true``) and ``publish --forbid-code`` asks
for; ``registry show``, its ``--json`` and the web page list them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from registry.rules import schemas
from registry.errors import DocumentError
from registry.gating.gates import GateResult

GATE = "code"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".joblib", ".dill",
                   ".npy", ".npz", ".h5", ".keras")
CODE_SUFFIXES = (".py", ".pyc", ".so", ".pyd")
AUTO_MAP_FILES = ("config.json", "tokenizer_config.json")


def code_files(paths: Iterable[str], read: Callable[[str], bytes | None]) -> dict[str, Any]:
    """The code a release carries.

    Args:
        paths: the release's file paths (its manifest).
        read: ``path -> bytes`` of a listed file (None or FileNotFoundError
            when absent); used for ``config.json`` and ``tokenizer_config.json``
            only. Its other errors (a file over its size limit) are raised.

    Returns:
        ``{"pickle": [paths], "remote_code": [paths], "auto_map": {file: {class:
        module}}}``, each sorted; ``auto_map`` values as the file states them.
    """
    listed = sorted(paths)
    pickles = [p for p in listed if p.lower().endswith(PICKLE_SUFFIXES)]
    remote = [p for p in listed if p.lower().endswith(CODE_SUFFIXES)]
    auto_map: dict[str, Any] = {}
    for name in AUTO_MAP_FILES:
        if name not in listed:
            continue
        try:
            data = read(name)
        except FileNotFoundError:  # listed but gone: the pull's check reports it
            data = None
        if data is None:
            continue
        try:
            doc = schemas.load_json(data, path=name)
        except DocumentError:
            continue  # not JSON: another gate or the engine says so; no auto_map to run
        found = doc.get("auto_map") if isinstance(doc, dict) else None
        if found:
            auto_map[name] = found
    return {"pickle": pickles, "remote_code": remote, "auto_map": auto_map}


def has_code(found: dict[str, Any]) -> bool:
    return bool(found["pickle"] or found["remote_code"] or found["auto_map"])


def describe(found: dict[str, Any]) -> str:
    """One line: ``"pickle files a.bin, b.pt; remote code x.py; auto_map in config.json"``."""
    parts = []
    if found["pickle"]:
        parts.append("pickle files " + ", ".join(found["pickle"][:5])
                     + (f" (+{len(found['pickle']) - 5})" if len(found["pickle"]) > 5 else ""))
    if found["remote_code"]:
        parts.append("remote code " + ", ".join(found["remote_code"][:5])
                     + (f" (+{len(found['remote_code']) - 5})"
                        if len(found["remote_code"]) > 5 else ""))
    if found["auto_map"]:
        parts.append("auto_map in " + ", ".join(sorted(found["auto_map"])))
    return "; ".join(parts) or "no pickle or remote-code files"


def gate_code(found: dict[str, Any]) -> GateResult:
    """The ``code`` gate: passes when the release carries no pickle and no
    remote code (only asked for when the policy forbids code)."""
    if has_code(found):
        return GateResult(GATE, False, f"the policy forbids code and the release has "
                                       f"{describe(found)}")
    return GateResult(GATE, True, "no pickle or remote-code files")
