"""MODEL_CARD.md, rendered from ``templates/MODEL_CARD.md`` with Jinja2."""

from __future__ import annotations

from typing import Any

from registry.resources import resource_dir


def render_card(facts: dict[str, Any]) -> str:
    """Render the model card.

    Args:
        facts: ``model_id``, ``version``, ``created_at``, ``source`` (run/step/
            manifest_sha256 or uri), ``dtype`` (the label of
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
    return env.from_string(template_text).render(**facts)
