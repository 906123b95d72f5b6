"""Release gates: pure functions from a release's facts to one result per check.

DESIGN section 5 and seed 000 "Released model": ``model_card`` (MODEL_CARD.md
present and non-empty), ``ledger`` (every row allows ``train`` and none is
revoked, in ledger.json or in the live ledger), ``evals`` (evals/summary.json
validates and ``passed``), and per-model thresholds (``metric>=value``).
Nothing here touches a store or a database: callers gather the facts.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from registry.errors import GateFailedError, UsageError
from registry.rules.words import count

__all__ = ["GateFailedError", "GateResult", "ReleaseFacts", "Threshold", "evaluate", "passed"]

_THRESHOLD = re.compile(r"\s*([A-Za-z0-9_./:-]+)\s*(>=|<=)\s*([-+0-9.eE]+|nan|inf)\s*")


@dataclass(frozen=True, slots=True)
class GateResult:
    """One check: its name (``model_card``, ``ledger``, ``evals``, ``policy:acc>=0.8``),
    whether it passed, and why, in one line."""

    name: str
    passed: bool
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"gate": self.name, "passed": self.passed, "reason": self.reason}


@dataclass(frozen=True, slots=True)
class Threshold:
    """A policy threshold: ``metric >= value`` (or ``<=``). ``metric`` matches a
    result's ``metric`` or ``task/metric``."""

    metric: str
    op: str
    value: float

    @classmethod
    def parse(cls, text: str) -> Threshold:
        """Parse ``"accuracy>=0.8"``. Raises UsageError (a ValueError) naming the text."""
        m = _THRESHOLD.fullmatch(text)
        if not m:
            raise UsageError(f"threshold {text!r}: expected METRIC>=VALUE or METRIC<=VALUE")
        value = float(m.group(3))
        if not math.isfinite(value):  # 1e999 is infinity: no index column holds it
            raise UsageError(f"threshold {text!r}: value is not a finite number")
        return cls(m.group(1), m.group(2), value)

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.value:g}"


@dataclass(frozen=True, slots=True)
class ReleaseFacts:
    """What the gates read of one release.

    Attributes:
        card: MODEL_CARD.md text, None when absent.
        ledger: ledger.json rows when they validate, else None.
        ledger_error: why ledger.json is missing or invalid.
        evals: evals/summary.json when it validates, else None.
        evals_error: why the summary is missing or invalid.
    """

    card: str | None
    ledger: list[dict[str, Any]] | None
    ledger_error: str | None
    evals: dict[str, Any] | None
    evals_error: str | None


def gate_model_card(card: str | None) -> GateResult:
    if card is None:
        return GateResult("model_card", False, "MODEL_CARD.md is missing")
    if not card.strip():
        return GateResult("model_card", False, "MODEL_CARD.md is empty")
    return GateResult("model_card", True, f"MODEL_CARD.md present ({len(card.encode())} bytes)")


def gate_ledger(rows: list[dict[str, Any]] | None, error: str | None,
                revoked: Mapping[str, str]) -> GateResult:
    """``revoked``: the live ledger, source_id -> revocation reason."""
    if rows is None:
        return GateResult("ledger", False, error or "ledger.json is missing")
    if not rows:
        return GateResult("ledger", False, "ledger.json lists no data source")
    problems = []
    for row in rows:
        sid = row["source_id"]
        if "train" not in row["allowed_uses"]:
            problems.append(f"source {sid} does not allow train "
                            f"(allowed_uses: {', '.join(row['allowed_uses']) or 'none'})")
        if row["revoked"]:
            problems.append(f"source {sid} is revoked in ledger.json "
                            f"({row.get('revocation_reason') or 'no reason given'})")
        elif sid in revoked:
            problems.append(f"source {sid} is revoked in the live ledger ({revoked[sid]})")
    if problems:
        return GateResult("ledger", False, "; ".join(problems))
    return GateResult("ledger", True,
                      f"{count(len(rows), 'source')}, all allow train, none revoked")


def gate_evals(summary: dict[str, Any] | None, error: str | None) -> GateResult:
    if summary is None:
        return GateResult("evals", False, error or "evals/summary.json is missing")
    failed = [f"{r['task']}/{r['metric']}={r['value']:g} vs threshold {r['threshold']:g}"
              for r in summary["results"] if not r["passed"]]
    if not summary["passed"] or failed:
        return GateResult("evals", False, "failed: " + ", ".join(failed))
    return GateResult("evals", True, f"suite {summary['suite']} {summary['suite_version']}: "
                                     f"{count(len(summary['results']), 'result')} passed")


def gate_threshold(summary: dict[str, Any] | None, t: Threshold) -> GateResult:
    name = f"policy:{t}"
    if summary is None:
        return GateResult(name, False, "no valid eval summary")
    values = [r["value"] for r in summary["results"]
              if t.metric in (r["metric"], f"{r['task']}/{r['metric']}")]
    if not values:
        return GateResult(name, False, f"metric {t.metric} not in the eval summary")
    bad = [v for v in values if not (v >= t.value if t.op == ">=" else v <= t.value)]
    if bad:
        return GateResult(name, False, f"{t.metric}={bad[0]:g}, required {t.op} {t.value:g}")
    return GateResult(name, True, f"{t.metric}={values[0]:g} {t.op} {t.value:g}")


def evaluate(facts: ReleaseFacts, *, revoked: Mapping[str, str],
             require: Iterable[Threshold] = ()) -> list[GateResult]:
    """Every gate, in a fixed order: model_card, ledger, evals, then thresholds."""
    results = [gate_model_card(facts.card),
               gate_ledger(facts.ledger, facts.ledger_error, revoked),
               gate_evals(facts.evals, facts.evals_error)]
    results += [gate_threshold(facts.evals, t) for t in require]
    return results


def passed(results: Iterable[GateResult]) -> bool:
    return all(r.passed for r in results)
