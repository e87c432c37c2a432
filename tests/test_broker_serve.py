"""`rmq-eventstore serve` as a real process: it serves clients and SIGTERM is a clean shutdown."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from rmq_eventstore.client import FOUND, Message, Producer, PullConsumer
from rmq_eventstore.common.fastjson import fastjson_loads


def test_serve_process_and_sigterm(tmp_path: Path) -> None:
    store = tmp_path / "store"
    proc = subprocess.Popen(
        [sys.executable, "-m", "rmq_eventstore", "serve", "--store", str(store), "--namesrv-port", "0",
         "--broker-port", "0", "--log-level", "WARNING"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        m = re.search(r"broker (\S+) serving .*; name server (\S+)", line)
        assert m, line + proc.stderr.read()
        namesrv = m.group(2)
        with Producer(namesrv, "pg") as p, PullConsumer(namesrv, "cg") as c:
            r = p.send(Message("orders", b"over the wire"), queue_id=0)
            res = c.pull("orders", 0, 0, suspend_timeout_ms=5000)
            assert res.status == FOUND and res.messages[0].body == b"over the wire"
            assert res.messages[0].msg_id == r.offset_msg_id
            c.commit_offset("orders", 0, res.next_begin_offset)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert "shutting down" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not (store / "abort").exists()  # a clean shutdown
    offsets = fastjson_loads((store / "config" / "consumerOffset.json").read_text())
    assert offsets["offsetTable"]["orders@cg"] == {0: 1}


def test_serve_refuses_a_store_that_is_already_open(tmp_path: Path) -> None:
    from rmq_eventstore.broker import serve_in_thread

    with serve_in_thread(tmp_path / "s") as rb:
        r = subprocess.run([sys.executable, "-m", "rmq_eventstore", "serve", "--store", str(tmp_path / "s"),
                            "--namesrv-port", "0", "--broker-port", "0"], capture_output=True, text=True,
                           timeout=60, env={**os.environ})
        assert r.returncode == 2 and "already open" in r.stderr
        assert rb.store.get_max_phy_offset() == 0
