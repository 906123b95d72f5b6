"""Start-up of the command line (issue 44 item 6): wall time of ``registry
--version``, ``registry --help``, ``registry ls`` and ``registry show`` against
``python -c pass``, measured in one run, round-robin (each round runs every
command once, in a rotating order, so load drifts over all alike).

Each command runs as the console script does (``from registry.cli import
main; main()`` in a fresh interpreter, this checkout first on ``sys.path``);
``ls`` and ``show`` read a local store and SQLite index holding one release
(built once, untimed). Targets: ``--version`` and ``--help`` under 0.15 s, a
read command under 0.35 s, absolute; the ratios to ``python -c pass`` say
how much of a loaded machine's time is the interpreter's own.

    python bench/startup_bench.py                 # 15 rounds
    python bench/startup_bench.py --rounds 5      # a quick run
    python bench/startup_bench.py --baseline /work/main   # also another checkout, same rounds

Writes ``bench/results-startup.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.release_util import one_release_store  # noqa: E402

MAIN = "from registry.cli import main; main()"
TARGETS = {"--version": 0.15, "--help": 0.15, "ls": 0.35, "show": 0.35}


def _run(argv: list[str], env: dict[str, str], cwd: Path) -> float:
    t = time.perf_counter()
    p = subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - t
    if p.returncode != 0:
        raise SystemExit(f"{argv}: exit {p.returncode}: {p.stderr.strip()}")
    return seconds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--out", default=str(REPO / "bench" / "results-startup.json"))
    ap.add_argument("--baseline", help="another checkout (the code before a change): its "
                                       "commands run in the same rounds, as 'baseline ...'")
    args = ap.parse_args()
    py = sys.executable
    with tempfile.TemporaryDirectory(prefix="startup-bench-") as tmp:
        work = Path(tmp)
        store, db = one_release_store(work)
        env = {**os.environ, "PYTHONPATH": str(REPO), "REGISTRY_CONFIG": str(work / "none.toml")}
        for var in ("REGISTRY_STORE", "REGISTRY_DB", "REGISTRY_PROFILE"):
            env.pop(var, None)
        cases = {
            "python -c pass": [py, "-c", "pass"],
            "--version": [py, "-c", MAIN, "--version"],
            "--help": [py, "-c", MAIN, "--help"],
            "ls": [py, "-c", MAIN, "ls", "--store", store, "--db", db],
            "show": [py, "-c", MAIN, "show", "m@1", "--store", store, "--db", db],
        }
        if args.baseline:
            base_env = {**env, "PYTHONPATH": str(Path(args.baseline).resolve())}
            for name in TARGETS:
                cases[f"baseline {name}"] = cases[name]
        envs = {name: base_env if name.startswith("baseline ") else env  # type: ignore[has-type]
                for name in cases}
        for name, argv in cases.items():  # warm the page cache and .pyc files, untimed
            _run(argv, envs[name], work)
        times: dict[str, list[float]] = {name: [] for name in cases}
        names = list(cases)
        load_before = os.getloadavg()
        for i in range(args.rounds):
            for name in names[i % len(names):] + names[:i % len(names)]:
                times[name].append(_run(cases[name], envs[name], work))
        load_after = os.getloadavg()
    base = statistics.median(times["python -c pass"])
    doc: dict[str, object] = {
        "rounds": args.rounds, "cpus": os.cpu_count(),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in load_after],
        "median_seconds": {k: round(statistics.median(v), 4) for k, v in times.items()},
        "min_seconds": {k: round(min(v), 4) for k, v in times.items()},
        "targets": {},
    }
    load = max(load_before[0], load_after[0])
    for name, limit in TARGETS.items():
        median = statistics.median(times[name])
        doc["targets"][f"registry {name}, median s (load {load:.1f}, "  # type: ignore[index]
                       f"{os.cpu_count()} CPUs; min {min(times[name]):.3f})"] = {
            "ours": round(median, 4), "peer": f"python -c pass {base:.3f} s",
            "ratio": round(median / base, 2), "target": f"< {limit} s",
            "over_python_seconds": round(median - base, 4)}
        if f"baseline {name}" in times:
            before = statistics.median(times[f"baseline {name}"])
            doc["targets"][f"registry {name}, median s, vs the baseline checkout "  # type: ignore[index]
                           f"(load {load:.1f})"] = {
                "ours": round(median, 4), "peer": f"baseline {before:.3f} s",
                "ratio": round(median / before, 2), "target": "(reported)"}
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
