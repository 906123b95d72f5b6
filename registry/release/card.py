"""MODEL_CARD.md, rendered from ``templates/MODEL_CARD.md`` with Jinja2."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from registry.host.resources import resource_dir


def card_source(source: Any) -> Any:
    """``source`` as the card names it: a local folder (a path, or a
    ``file://`` URL) by its last name only, with ``"local": True``, so an
    immutable release does not carry the publisher's home or working
    directory; a remote URI (``s3://``, an OCI reference) and a checkpoint
    source unchanged. The manifest's own ``meta.source`` is not changed here."""
    uri = source.get("uri") if isinstance(source, Mapping) else None
    if not isinstance(uri, str) or ("://" in uri and not uri.startswith("file://")):
        return source
    path = uri.removeprefix("file://").rstrip("/")
    return {**source, "uri": os.path.basename(path) or path, "local": True}


def render_card(facts: dict[str, Any]) -> str:
    """Render the model card.

    Args:
        facts: ``model_id``, ``version``, ``created_at``, ``source`` (run/step/
            manifest_sha256 or uri; a local folder named by its last name only,
            :func:`card_source`), ``dtype`` (the label of
            :func:`registry.release.convert.dtype_label`), ``weights`` (the
            stored tensor groups, :func:`~registry.release.convert.weights_groups`),
            ``converted`` (the ``--dtype`` asked, or None: as published),
            ``group_size``,
            ``parameter_count``, ``evals`` (the summary), ``ledger`` (rows),
            ``heads`` (documents), plus free ``card_fields`` such as
            ``description``, ``intended_use``, ``limitations``.

    Raises:
        jinja2.UndefinedError: a fact the template needs is missing (a bug).
    """
    template_text = (resource_dir("templates") / "MODEL_CARD.md").read_text(encoding="utf-8")
    import jinja2  # only a publish renders a card

    env = jinja2.Environment(undefined=jinja2.ChainableUndefined, keep_trailing_newline=True,
                             autoescape=False, trim_blocks=False)
    return env.from_string(template_text).render(**{**facts,
                                                     "source": card_source(facts.get("source"))})
