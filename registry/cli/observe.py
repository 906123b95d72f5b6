"""The root options ``--log-format``, ``--metrics-file`` and ``--metrics-push``.

``registry --metrics-file /var/lib/node_exporter/textfile/registry.prom pull ...``
(or ``REGISTRY_METRICS_FILE``) writes the metric families of registry.obs.metrics,
plus ``registry_command_*`` gauges for the command, to a node-exporter textfile
when the command ends, success or failure; ``--metrics-push URL``
(``REGISTRY_METRICS_PUSH``) pushes them to a Pushgateway (job ``registry``,
grouping key ``command``). Failing to write or push is a warning line; the
command's exit code stands. ``--log-format json`` (``REGISTRY_LOG_FORMAT``)
makes errors and request logs JSON lines (registry.obs.logs).
"""

from __future__ import annotations

import os
from typing import Any

from registry.obs import logs, metrics

_RUN: metrics.BatchRun | None = None


def start(ctx: Any, *, log_format: str | None, metrics_file: str | None,
          metrics_push: str | None) -> None:
    """Apply the root options for the command ``ctx`` is about to run.

    Raises:
        UsageError: an unknown log format, or a bad metrics destination
            (metrics.BatchRun).
    """
    global _RUN
    from registry.errors import UsageError

    if log_format is not None:
        if log_format not in logs.FORMATS:
            raise UsageError(f"--log-format {log_format}: give one of "
                             f"{', '.join(logs.FORMATS)}")
        os.environ[logs.ENV] = log_format
    if metrics_file is None and metrics_push is None:
        return
    command = ctx.invoked_subcommand or "registry"  # a group's name for its commands
    _RUN = metrics.BatchRun(command, path=metrics_file, push=metrics_push)
    ctx.call_on_close(_finish)


def failed(error_class: str, code: int) -> None:
    """A command is ending with ``code`` because of an error of ``error_class``
    (called by registry.cli.errors.fail): counted as a refusal by reason, and
    as the command's exit code."""
    metrics.refused(error_class)
    if _RUN is not None:
        _RUN.failed(code)


def _finish() -> None:
    global _RUN
    run, _RUN = _RUN, None
    if run is None:
        return
    from registry.cli.output import echo
    from registry.host.redact import redact

    for warning in run.finish():
        echo(f"warning: {redact(warning)}", err=True)
