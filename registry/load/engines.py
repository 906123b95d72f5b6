"""Engines built from verified weights, without writing the weights to disk.

- :func:`transformers_model`: the model class of the release's
  ``config.json`` (``architectures[0]``, else ``AutoModel``), given the
  reader's state dict through transformers' own loading path
  (``from_pretrained(None, config=..., state_dict=...)``: its key renaming,
  tied weights and dtype handling, exactly as ``from_pretrained`` of the pulled
  directory).
- :func:`sentence_transformer`: a sentence-transformers model. Its small
  files (``modules.json``, pooling and tokenizer configs, the tokenizer) are
  read from the store, each checked against its sha256, into a private
  temporary folder that is removed once the model is built; the weights never
  touch the disk: the Transformer module gets them from the reader
  (:class:`VerifiedTransformer`).

Both raise what :func:`registry.load.open_weights` raises, plus
DocumentError when the release has no usable ``config.json``.
"""

from __future__ import annotations

import json
import tempfile
import threading
from pathlib import Path
from typing import Any

from registry.errors import DocumentError
from registry.load.layout import config_document, write_small_files
from registry.load.reader import WeightsReader

_STATE = threading.local()


def _reader(ref: Any, kw: dict[str, Any]) -> tuple[WeightsReader, bool]:
    if isinstance(ref, WeightsReader):
        return ref, False
    from registry.load import open_weights

    return open_weights(ref, **kw), True


def _config(reader: WeightsReader) -> Any:
    import transformers

    doc = config_document(reader.store, reader.prefix, reader.manifest)
    where = f"{reader.store.url_of(reader.prefix)}/config.json"
    if doc is None or not isinstance(doc.get("model_type"), str):
        raise DocumentError(where, "a transformers model needs config.json with a model_type")
    doc = dict(doc)
    return transformers.AutoConfig.for_model(doc.pop("model_type"), **doc)


def concrete(auto: Any, config: Any) -> Any:
    """The model class an ``Auto*`` class would pick for ``config`` (the Auto
    classes need a path to load from; ``from_pretrained(None, state_dict=...)``
    is the concrete classes')."""
    return auto._model_mapping[type(config)]


def transformers_model(ref: Any, *, model_class: Any = None, dtype: Any = "auto",
                       **open_kw: Any) -> Any:
    """A transformers model of the release ``ref`` (a ref string, opened with
    ``open_kw``, or an open :class:`WeightsReader`), in eval mode."""
    import transformers

    reader, own = _reader(ref, open_kw)
    try:
        config = _config(reader)
        if model_class is None:
            arch = (getattr(config, "architectures", None) or [None])[0]
            model_class = getattr(transformers, arch, None) if arch else None
            model_class = model_class or concrete(transformers.AutoModel, config)
        state = reader.state_dict()
    finally:
        if own:
            reader.close()
    model = model_class.from_pretrained(None, config=config, state_dict=state, dtype=dtype)
    return model.eval()


def sentence_transformer(ref: Any, **open_kw: Any) -> Any:
    """A sentence-transformers model of the release ``ref`` (see the module
    docstring), on the CPU."""
    from sentence_transformers import SentenceTransformer

    reader, own = _reader(ref, open_kw)
    try:
        with tempfile.TemporaryDirectory(prefix="registry-st-") as tmp:
            folder = Path(tmp)
            write_small_files(reader, folder)
            modules = folder / "modules.json"
            if not modules.exists():
                raise DocumentError(f"{reader.store.url_of(reader.prefix)}/modules.json",
                                    "missing: not a sentence-transformers model")
            doc = json.loads(modules.read_text())
            for m in doc:
                if m.get("type") == "sentence_transformers.models.Transformer":
                    m["type"] = f"{__name__}.VerifiedTransformer"
            modules.write_text(json.dumps(doc))
            _STATE.state = reader.state_dict()
            try:
                return SentenceTransformer(str(folder), device="cpu")
            finally:
                _STATE.state = None
    finally:
        if own:
            reader.close()


def _transformer_class() -> Any:
    from sentence_transformers.models import Transformer

    class VerifiedTransformer(Transformer):  # type: ignore[misc]
        """sentence-transformers' Transformer whose weights come from the
        reader's verified state dict instead of files."""

        def _load_model(self, model_name_or_path: str, config: Any, cache_dir: Any,
                        backend: str, is_peft_model: bool, **model_args: Any) -> None:
            from transformers import AutoModel

            state = getattr(_STATE, "state", None)
            if state is None or backend != "torch":
                raise DocumentError(model_name_or_path, "VerifiedTransformer is built by "
                                    "registry.load.engines.sentence_transformer only")
            model_args.pop("state_dict", None)
            cls = concrete(AutoModel, config)
            self.auto_model = cls.from_pretrained(None, config=config, state_dict=state,
                                                  **model_args)

    return VerifiedTransformer


def __getattr__(name: str) -> Any:
    if name == "VerifiedTransformer":
        cls = _transformer_class()
        globals()[name] = cls
        return cls
    raise AttributeError(name)


__all__ = ["sentence_transformer", "transformers_model"]
