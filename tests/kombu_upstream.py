"""kombu's own integration mixins (`t/integration/common.py`), from the sdist of the installed kombu.

The sdist is downloaded at test time (`pip download --no-binary :all: --no-deps kombu==<version>`) and
unpacked under `.cache/` (gitignored); kombu's source is never committed. `make kombu-sdist` does the
same ahead of time. `load_common()` returns the module, or raises `RuntimeError` saying why it cannot.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tarfile
from pathlib import Path
from types import ModuleType

import kombu

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache"


def sdist_dir(version: str = kombu.__version__) -> Path:
    """`.cache/kombu-<version>`, downloaded and unpacked if it is not there yet."""
    target = CACHE / f"kombu-{version}"
    if (target / "t" / "integration" / "common.py").is_file():
        return target
    CACHE.mkdir(exist_ok=True)
    archive = CACHE / f"kombu-{version}.tar.gz"
    if not archive.is_file():
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
                            f"kombu=={version}", "-d", str(CACHE)], capture_output=True, text=True, timeout=300)
        if r.returncode != 0 or not archive.is_file():
            raise RuntimeError(f"could not download the kombu {version} sdist: {r.stderr.strip()[-500:]}")
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(f"kombu-{version}/t/")]
        tar.extractall(CACHE, members=members, filter="data")
    return target


def load_common(version: str = kombu.__version__) -> ModuleType:
    """kombu's `t/integration/common.py` as module `kombu_upstream_common`."""
    path = sdist_dir(version) / "t" / "integration" / "common.py"
    spec = importlib.util.spec_from_file_location("kombu_upstream_common", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


if __name__ == "__main__":
    print(sdist_dir())
