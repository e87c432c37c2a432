"""`local_session()`'s JVM options, read back from the running JVM (a fresh process: the tests' shared
session is a `fast_jvm` one)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import json, sys
    from rmq_eventstore.spark.session import local_session

    conf = json.loads(sys.argv[1])
    spark = local_session(master="local[1]", app_name="session-options", conf=conf)
    jvm = spark.sparkContext._jvm
    beans = jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()
    names = [beans.get(i).getName() for i in range(beans.size())]
    arrow = jvm.java.lang.System.getProperty("arrow.enable_null_check_for_get")
    print(json.dumps({"gc": names, "arrow": arrow}))
    spark.stop()
""")


def _run(conf: dict[str, str]) -> dict:
    p = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(conf)], capture_output=True, text=True,
                       timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_a_local_session_runs_the_parallel_collector_and_a_users_java_options_replace_ours() -> None:
    ours = _run({})
    assert sorted(ours["gc"]) == ["PS MarkSweep", "PS Scavenge"], ours  # THROUGHPUT_GC, not the JVM's default G1
    assert ours["arrow"] == "false"  # ARROW_JAVA_OPTS still there
    theirs = _run({"spark.driver.extraJavaOptions": "-XX:+UseSerialGC"})
    assert sorted(theirs["gc"]) == ["Copy", "MarkSweepCompact"], theirs
    assert theirs["arrow"] is None
