"""The native core (issue 16): the C extensions `rmq_eventstore._native` (store) and
`rmq_eventstore._spark_native` (the Spark source's scan), built by `pip install` / `make`.

Everything else about the project is in pyproject.toml. The extension is optional: when it cannot be built
(no C compiler) the install still succeeds and the store uses its pure-Python loops (`codec.NATIVE` says
which are active; `RMQ_EVENTSTORE_PURE=1` forces the pure-Python ones). zlib's CRC-32 is used when zlib's
header is installed (zlib1g-dev / zlib-devel), else the extension's own (same values, slower).
"""

import os
import sys
import sysconfig

import setuptools
from setuptools import Extension, setup

# pyproject.toml's `license = "Apache-2.0"` (an SPDX expression, PEP 639) needs setuptools 77 or newer, which
# `pip install` / `make native` fetch by themselves (build-system.requires); a direct `python setup.py ...` uses
# the setuptools installed here, and an older one fails deep in its config validation. Say so instead.
if int(setuptools.__version__.split(".")[0]) < 77:
    sys.exit(f"rmq-eventstore's build needs setuptools >= 77 (this Python has {setuptools.__version__}): "
             "build with `pip install -e .` or `make native`, which fetch it, or upgrade it first "
             "(`pip install -U 'setuptools>=77'`)")


def _have_zlib_header() -> bool:
    dirs = [sysconfig.get_config_var("INCLUDEDIR") or "", "/usr/include", "/usr/local/include",
            *os.environ.get("CPATH", "").split(os.pathsep)]
    return any(d and os.path.exists(os.path.join(d, "zlib.h")) for d in dirs)


zlib = _have_zlib_header()
setup(
    ext_modules=[
        Extension(
            "rmq_eventstore._native",
            sources=["rmq_eventstore/_native.c"],
            define_macros=[("RMQ_HAVE_ZLIB", "1")] if zlib else [],
            libraries=["z"] if zlib else [],
            extra_compile_args=["-O2"],
            optional=True,
        ),
        Extension(  # the Spark source's commitlog scan (rmq_eventstore.spark.decode); optional as well
            "rmq_eventstore._spark_native",
            sources=["rmq_eventstore/_spark_native.c"],
            define_macros=[("RMQ_HAVE_ZLIB", "1")] if zlib else [],
            libraries=["z"] if zlib else [],
            extra_compile_args=["-O2"],
            optional=True,
        ),
    ]
)
