"""vLLM model-loader plug-in: ``--load-format registry`` (issue 43 item 5).

vLLM finds it through the ``vllm.general_plugins`` entry point this package
declares (``registry = registry.load.vllm_plugin:register``), which registers
the loader under the name ``registry`` with vLLM's loader registry
(``vllm.model_executor.model_loader.register_model_loader``). vLLM still reads
the model's config and tokenizer from ``--model DIR``; the weights come from
the store through :func:`registry.load.open_weights`, every piece verified,
under the same trust rules as ``registry pull``::

    registry load tiny-lm@prod --config-to /srv/tiny-lm   # config + tokenizer, no weights
    vllm serve /srv/tiny-lm --load-format registry \\
        --model-loader-extra-config '{"ref": "tiny-lm@prod", "store": "s3://b/registry",
                                      "trusted_keys": ["/etc/registry/keys/release.pub"]}'

Each tensor-parallel rank reads every tensor its model asks for through
``model.load_weights`` (vLLM's own sharding of the names it receives). Tested
where vLLM imports; vLLM is not a dependency of this package.
"""

from __future__ import annotations

from typing import Any


def options(extra: Any) -> dict[str, Any]:
    """The loader's options from ``--model-loader-extra-config`` (a dict or JSON)."""
    import json

    from registry.errors import UsageError

    doc = json.loads(extra) if isinstance(extra, str) else dict(extra or {})
    if not isinstance(doc.get("ref"), str):
        raise UsageError("--model-loader-extra-config: needs \"ref\": \"MODEL_ID@VERSION|ALIAS\"")
    allowed = {"ref", "store", "trusted_keys", "allow_yanked", "require_passing", "cache"}
    unknown = sorted(set(doc) - allowed)
    if unknown:
        raise UsageError(f"--model-loader-extra-config: unknown keys {unknown} "
                         f"(allowed: {sorted(allowed)})")
    return doc


def register() -> None:
    """Register the ``registry`` load format with vLLM (the entry point)."""
    from vllm.model_executor.model_loader import register_model_loader
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader

    @register_model_loader("registry")
    class RegistryModelLoader(BaseModelLoader):  # type: ignore[misc,unused-ignore]
        def download_model(self, model_config: Any) -> None:
            """Nothing to download: the weights stream at load time."""

        def load_weights(self, model: Any, model_config: Any) -> None:
            from registry.load import open_weights

            opts = options(self.load_config.model_loader_extra_config)
            ref = opts.pop("ref")
            with open_weights(ref, **opts) as reader:
                model.load_weights(reader.tensors())


__all__ = ["options", "register"]
