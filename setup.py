"""The native core (issue 16): the C extensions `rmq_eventstore._native` (store) and
`rmq_eventstore._spark_native` (the Spark source's scan), built by `pip install` / `make`.

Everything else about the project is in pyproject.toml. The extension is optional: when it cannot be built
(no C compiler) the install still succeeds and the store uses its pure-Python loops (`codec.NATIVE` says
which are active; `RMQ_EVENTSTORE_PURE=1` forces the pure-Python ones). zlib's CRC-32 is used when zlib's
header is installed (zlib1g-dev / zlib-devel), else the extension's own (same values, slower).
"""

import os
import sysconfig

from setuptools import Extension, setup


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
