"""Upstream test suites (kombu's and Celery's own), from the sdists of the installed kombu and celery.

An sdist is downloaded at test time (`pip download --no-binary :all: --no-deps <project>==<version>`) and
the parts the tests need are unpacked under `.cache/<project>-<version>/` (gitignored); upstream source is
never committed. `make upstream-sdists` does the same ahead of time. Every function raises `RuntimeError`
saying why when the sdist cannot be had (no network, no such release).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tarfile
from pathlib import Path
from types import ModuleType

import celery
import kombu

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache"


def sdist_dir(project: str, version: str, members: tuple[str, ...], marker: str) -> Path:
    """`.cache/<project>-<version>` holding the sdist's `members` (paths or directory prefixes inside the
    sdist's top directory), downloaded and unpacked unless `marker` (a file inside it) is there already."""
    target = CACHE / f"{project}-{version}"
    if (target / marker).is_file():
        return target
    CACHE.mkdir(exist_ok=True)
    archive = CACHE / f"{project}-{version}.tar.gz"
    if not archive.is_file():
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
                            f"{project}=={version}", "-d", str(CACHE)], capture_output=True, text=True, timeout=300)
        if r.returncode != 0 or not archive.is_file():
            raise RuntimeError(f"could not download the {project} {version} sdist: {r.stderr.strip()[-500:]}")
    top = f"{project}-{version}/"
    wanted = tuple(top + m for m in members)
    with tarfile.open(archive) as tar:
        chosen = [m for m in tar.getmembers() if m.name.startswith(wanted)]
        tar.extractall(CACHE, members=chosen, filter="data")
    if not (target / marker).is_file():
        raise RuntimeError(f"the {project} {version} sdist has no {marker}")
    return target


def kombu_dir(version: str = kombu.__version__) -> Path:
    """kombu's test tree (`t/`), for its integration mixins."""
    return sdist_dir("kombu", version, ("t/",), "t/integration/common.py")


def celery_dir(version: str = celery.__version__) -> Path:
    """Celery's test tree (`t/`) and its `pyproject.toml` (pytest's settings: test classes are named
    `test_*`, the markers): the root directory to run `t/integration` from."""
    return sdist_dir("celery", version, ("t/", "pyproject.toml"), "t/integration/conftest.py")


def load_common(version: str = kombu.__version__) -> ModuleType:
    """kombu's `t/integration/common.py` as module `kombu_upstream_common`."""
    path = kombu_dir(version) / "t" / "integration" / "common.py"
    spec = importlib.util.spec_from_file_location("kombu_upstream_common", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


if __name__ == "__main__":
    print(kombu_dir())
    print(celery_dir())
