"""Where a release of a LoongSage step takes its files from (seed 003 sections 2, 4.3).

A LoongSage step (``train_step_<N>/``) may hold ``hf_model/`` (the HF export,
released as any model directory) and ``dist_ckpt/`` (torch DCP shards, released
by consolidating the ``model.<name>`` tensors:
:mod:`registry.release.dcp_source`). For ``dist_ckpt/`` the weights come from
the shards; config.json and the tokenizer files (:data:`HF_FILES`, those
present) from ``hf_model_path`` -- the seed's "HuggingFace model path ...
provides the model structure information" -- or, when none is given, from the
step's own ``hf_model/`` (what the step recorded, checked against its
MANIFEST.json like every byte a release takes from a checkpoint).

Torch-free: PyTorch (the ``[torch]`` extra) is imported only for a
``dist_ckpt`` release.
"""

from __future__ import annotations

from typing import Any

from registry.checkpoint.loongsage_format import DIST, HF
from registry.errors import DocumentError, ObjectNotFoundError, TorchUnavailableError, UsageError
from registry.protocol.manifest import Manifest
from registry.store import Store, join, open_store
from registry.formats.weights import is_weights_name

#: taken with the weights of a dist_ckpt release, those present (config.json required).
HF_FILES = ("config.json", "generation_config.json", "tokenizer.json",
            "tokenizer_config.json", "special_tokens_map.json")
PARTS = ("auto", HF, DIST)


def choose_part(part: str, manifest: Manifest, where: str) -> str:
    """``hf_model`` or ``dist_ckpt``; ``auto``: ``hf_model`` when the step's
    manifest lists files under it, else ``dist_ckpt`` when it lists those.

    Raises:
        UsageError: another value.
    """
    if part not in PARTS:
        raise UsageError(f"--from {part!r}: expected one of {', '.join(PARTS)}")
    if part != "auto":
        return part
    paths = [e.path for e in manifest.files]
    if any(p.startswith(f"{HF}/") for p in paths) or not any(
            p.startswith(f"{DIST}/") for p in paths):
        return HF
    return DIST


def dist_source(store: Store, step_prefix: str, manifest: Manifest,
                hf_model_path: Any) -> tuple[Store, str, dict[str, int], dict[str, str] | None,
                                             Any]:
    """The source of a release of ``step_prefix``'s ``dist_ckpt/``.

    Returns:
        ``(config store, config prefix, config file name -> size, their
        sha256 by name (the step's, when taken from its hf_model/) or None,
        the DcpWeights)``.

    Raises:
        TorchUnavailableError: no PyTorch.
        UsageError: no ``hf_model_path`` and no ``hf_model/config.json`` in the step.
        DocumentError: ``hf_model_path`` has no config.json.
        CheckpointError, IntegrityError, UnsafeCheckpointError: as
            :class:`registry.release.dcp_source.DcpWeights`.
    """
    url = store.url_of(join(step_prefix, DIST))
    try:
        import torch  # noqa: F401
        from registry.release.dcp_source import DcpWeights
    except ImportError:
        raise TorchUnavailableError(f"{url}: releasing torch DCP shards (dist_ckpt) needs "
                                    "PyTorch: pip install 'modeldir-registry[torch]'") from None
    if hf_model_path is not None:
        hf = hf_model_path if isinstance(hf_model_path, Store) else open_store(str(hf_model_path))
        names = {}
        for name in HF_FILES:
            try:
                names[name] = hf.info(name).size
            except ObjectNotFoundError:
                if name == "config.json":
                    raise DocumentError(hf.url_of(name), "missing: hf_model_path must hold the "
                                                         "HF config.json of the model") from None
        return hf, "", names, None, DcpWeights(store, step_prefix, manifest)
    listed = {e.path[len(HF) + 1:]: e for e in manifest.files if e.path.startswith(f"{HF}/")}
    if "config.json" not in listed:
        raise UsageError(f"{url}: releasing dist_ckpt needs hf_model_path (--hf-model-path): "
                         "the HF config.json and tokenizer files of the model (seed 003 section "
                         "2); the step holds no hf_model/config.json to take them from")
    kept = {n: e for n, e in listed.items() if n in HF_FILES and not is_weights_name(n)}
    return (store, join(step_prefix, HF), {n: e.size for n, e in kept.items()},
            {n: e.sha256 for n, e in kept.items()}, DcpWeights(store, step_prefix, manifest))
