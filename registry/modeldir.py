"""Rules of a model directory (seed 000, first paragraph; DESIGN section 4).

A model directory holds ``model.safetensors`` and ``config.json``, and
``tokenizer.json`` when config.json says ``"tl_tokenizer": "file"``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from registry.errors import DocumentError

_HIDDEN_KEYS = ("hidden_size", "d_model", "n_embd", "dim", "hidden_dim")


def hidden_size(config: dict[str, Any]) -> int | None:
    """The model's hidden size from its config (Hugging Face and tinyllm names)."""
    for key in _HIDDEN_KEYS:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def check_files(names: Iterable[str], config: dict[str, Any], *, where: str) -> None:
    """Raise DocumentError when a required file of a model directory is missing."""
    present = set(names)
    for required in ("model.safetensors", "config.json"):
        if required not in present:
            raise DocumentError(f"{where}/{required}", "missing: a model directory needs it")
    if config.get("tl_tokenizer") == "file" and "tokenizer.json" not in present:
        raise DocumentError(f"{where}/tokenizer.json",
                            "missing: config.json says \"tl_tokenizer\": \"file\"")
