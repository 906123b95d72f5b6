"""Observability: Prometheus metrics, OpenTelemetry traces and JSON log lines.

Nothing here costs anything until it is switched on: :mod:`registry.obs.metrics`
keeps no metric (and imports no ``prometheus_client``) until ``registry serve``
or ``--metrics-file`` / ``--metrics-push`` enables it; :mod:`registry.obs.tracing`
is a no-op unless the ``otel`` extra is installed and the standard ``OTEL_*``
variables ask for traces. The hooks the rest of the package calls are
module-level functions that return at once while off.

May import: errors, host/ and rules/ (limits, names) and nothing else of the package.


Rooms it may import (tests/test_house.py keeps this list): errors, host, rules.
"""

from __future__ import annotations
