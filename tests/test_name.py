"""The distribution's name is one PyPI does not give to another project (issue 33 item 1).

``model-registry`` on PyPI is Kubeflow's client; ``registry`` is a Windows registry
library. The distribution is ``modeldir-registry`` and ``modeldir_registry`` is an
import name beside ``registry`` (docs/decisions.md, "A name of its own").
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DIST = "modeldir-registry"
#: an install hint or requirement that names the other project's distribution.
OLD = re.compile(r"""pip install ['"]?model-registry\b|\bmodel-registry\[""")


def test_pyproject_names_the_distribution_and_ships_both_import_names():
    doc = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert doc["project"]["name"] == DIST
    assert doc["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"] == [
        "registry", "modeldir_registry"]


def test_no_install_hint_names_the_other_project():
    # Every message that says what to install, the README, the docs and the
    # quickstart's hints; decisions.md may quote the old name as history.
    files = [p for p in [*REPO.glob("registry/**/*.py"), *REPO.glob("modeldir_registry/*.py"),
                         REPO / "README.md", *REPO.glob("docs/*.md"), *REPO.glob("tests/*.py"),
                         *REPO.glob("bench/*.py"), *REPO.glob("examples/**/*")]
             if p.is_file() and p.name != "decisions.md" and p != Path(__file__).resolve()]
    assert len(files) > 50
    found = [f"{p.relative_to(REPO)}:{i}: {line.strip()}" for p in files
             for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
             if OLD.search(line)]
    assert found == []


def test_the_new_import_name_is_the_same_modules():
    code = ("import modeldir_registry as m, registry\n"
            "import modeldir_registry.checkpoint.layout as a, registry.checkpoint.layout as b\n"
            "from modeldir_registry.store import open_store\n"
            "from modeldir_registry.protocol.layout import release_prefix\n"
            "import registry.store, registry.protocol.layout\n"
            "assert a is b and open_store is registry.store.open_store\n"
            "assert release_prefix is registry.protocol.layout.release_prefix\n"
            "assert m.__version__ == registry.__version__ and m.open_store is open_store\n"
            "try:\n    import modeldir_registry.no_such_module\n"
            "except ModuleNotFoundError:\n    print('ok')\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
