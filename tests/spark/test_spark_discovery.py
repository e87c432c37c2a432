"""Spark finds the `rocketmq` source by name: a plain SparkSession, in the virtualenv as a user activates it,
reads and streams a store without `register()` (PySpark 4 registers `pyspark_*` modules' `DefaultSource`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from rmq_eventstore.store import Message, MessageStore
from tests.conftest import SMALL_GEOMETRY

USER_SCRIPT = textwrap.dedent("""
    import json, sys
    from pyspark.sql import SparkSession

    store = sys.argv[1]
    spark = (SparkSession.builder.master("local[1]").appName("plain-user-session")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    df = spark.read.format("rocketmq").load(store)
    batch = sorted(r.body.decode() for r in df.where("topic = 'found'").select("body").collect())
    stream = (spark.readStream.format("rocketmq").load(store).where("topic = 'found'")
              .writeStream.format("memory").queryName("found_stream").trigger(availableNow=True).start())
    stream.awaitTermination(120)
    streamed = sorted(r.body.decode() for r in spark.sql("SELECT body FROM found_stream").collect())
    print(json.dumps({"batch": batch, "stream": streamed}))
    spark.stop()
""")


def test_a_plain_session_in_the_activated_venv_reads_and_streams_without_register(tmp_path: Path) -> None:
    root = tmp_path / "store"
    with MessageStore.open(root, **SMALL_GEOMETRY) as store:
        for i in range(20):
            assert store.put_message(Message(topic="found", body=f"e{i:02d}".encode(), queue_id=i % 2)).is_ok()
        assert store.put_message(Message(topic="other", body=b"x")).is_ok()
        store.wait_for_dispatch()
    script = tmp_path / "user_job.py"
    script.write_text(USER_SCRIPT)
    venv_bin = Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    env.update(VIRTUAL_ENV=str(venv_bin.parent), PATH=f"{venv_bin}{os.pathsep}{env.get('PATH', '')}",
               SPARK_LOCAL_IP="127.0.0.1")
    # Run from an unrelated directory: the source must come from the installed distribution, not the cwd.
    done = subprocess.run(["python", str(script), str(root)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    expected = [f"e{i:02d}" for i in range(20)]
    assert result["batch"] == expected
    assert result["stream"] == expected
