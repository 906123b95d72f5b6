"""Jinja2 for the pages (``templates/web/``), with every value escaped, and the
model card's Markdown rendered with raw HTML turned off."""

from __future__ import annotations

from functools import cache
from typing import Any

import jinja2
from markdown_it import MarkdownIt
from markupsafe import Markup

from registry.host.redact import redact
from registry.host.resources import resource_dir
from registry.web.charts import Chart, render_svg
from registry.web.modelpath import model_segment


def human_bytes(n: int | None) -> str:
    """``1536`` -> ``"1.5 KiB"``."""
    if n is None:
        return ""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


@cache
def _markdown() -> MarkdownIt:
    # html=False: a card's <script> or <img onerror> is shown as text, never run;
    # markdown-it also refuses javascript: and data: link targets.
    return MarkdownIt("commonmark", {"html": False}).enable("table")


def markdown(text: str) -> Markup:
    """A MODEL_CARD.md as HTML, with any HTML in it escaped."""
    return Markup(_markdown().render(text))


def chart(c: Chart) -> Markup:
    return render_svg(c)


def _redacted(value: Any) -> Any:
    if isinstance(value, Markup):  # HTML made here (a chart, the card): stays HTML
        return Markup(redact(str(value)))
    return redact(value) if isinstance(value, str) else value


@cache
def environment() -> jinja2.Environment:
    loader = jinja2.FileSystemLoader(str(resource_dir("templates") / "web"))
    # finalize: every value a page shows is redacted (a store URL with a password)
    env = jinja2.Environment(loader=loader, autoescape=True, undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True,
                             finalize=_redacted)
    env.filters.update(human_bytes=human_bytes, markdown=markdown, chart=chart,
                       idpath=model_segment)
    return env


def render(template: str, **context: Any) -> str:
    """Render ``templates/web/<template>`` with ``context`` (autoescaped)."""
    return environment().get_template(template).render(**context)
