"""A local SparkSession that starts fast and stays quiet, with the `rocketmq` source registered.

Defaults for local runs (tests, the CLI jobs, notebooks): no UI, no console progress bars, few shuffle
partitions, UTC session time, Python filter pushdown on, log level ERROR, Arrow Java's per-value checks
off (`ARROW_JAVA_OPTS`), the parallel garbage collector (`THROUGHPUT_GC`), and the project importable by
the Python workers (they inherit `PYTHONPATH` from the JVM, so it is set before the JVM starts).
"""

from __future__ import annotations

import os
import sys
import tempfile
from typing import Any

from pyspark.sql import SparkSession

from . import jvm
from .datasource import register

_PKG_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_LOG4J = """rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
"""


ARROW_JAVA_OPTS = "-Darrow.enable_unsafe_memory_access=true -Darrow.enable_null_check_for_get=false"
# The throughput collector for a local session's JVM (driver = executor): a full scan allocates a
# UTF8String per value Spark copies into its rows, and the parallel collector's young collections cost
# half of G1's pauses there (the bench store's JVM scan: 7-17% less wall in 9 of 9 alternating runs).
THROUGHPUT_GC = "-XX:+UseParallelGC"


def _log4j_file() -> str:
    path = os.path.join(tempfile.gettempdir(), "rmq-eventstore-log4j2-quiet.properties")
    if not os.path.exists(path):
        tmp = f"{path}.{os.getpid()}"
        with open(tmp, "w") as fh:
            fh.write(_LOG4J)
        os.replace(tmp, path)
    return path


def local_session(master: str = "local[2]", app_name: str = "rmq-eventstore", fast_jvm: bool = False,
                  conf: dict[str, str] | None = None) -> Any:
    """Get or create a quiet local SparkSession with the `rocketmq` format registered.

    The JVM runs the parallel (throughput) collector, `THROUGHPUT_GC`; `fast_jvm` instead adds
    `-XX:+UseSerialGC -XX:TieredStopAtLevel=1` (about 3 s faster to start; for tests, not for throughput).
    `conf` overrides any setting (a `spark.driver.extraJavaOptions` of yours replaces all of these). When the JVM reader's jar is built (`make spark-jar`,
    `rmq_eventstore.spark.jvm`) it goes on `spark.jars`, which adds `format("rocketmq-jvm")`.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if _PKG_ROOT not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([_PKG_ROOT, *[p for p in paths if p]])
    # Arrow Java without bounds and null checks on every get: Spark's conversion of the Python source's
    # Arrow batches to rows reads each value through them (about 20% of that task's CPU). The batches
    # come from pyarrow in our own workers. Local mode: the driver JVM is the executor.
    java_opts = f"{ARROW_JAVA_OPTS} -Dlog4j2.configurationFile=file:{_log4j_file()}"
    if fast_jvm:
        java_opts = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1 " + java_opts
    else:
        java_opts = f"{THROUGHPUT_GC} {java_opts}"
    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.python.filterPushdown.enabled": "true",
        "spark.driver.extraJavaOptions": java_opts,
        "spark.log.level": "ERROR",
    }
    jar = jvm.jar_path()
    if jar is not None:
        settings["spark.jars"] = str(jar)
    settings.update(conf or {})
    builder = SparkSession.builder.master(master).appName(app_name)
    for k, v in settings.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark
