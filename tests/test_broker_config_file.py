"""`rmq-eventstore serve -c broker.conf`: RocketMQ's properties file with RocketMQ's names."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rmq_eventstore.broker.config_file import BrokerConfigFileError, known_names, load_broker_conf
from rmq_eventstore.client import FOUND, Message, PullConsumer, TransactionProducer, TransactionState
from rmq_eventstore.store import FlushDiskType


def test_rocketmq_names_map_to_our_settings(tmp_path: Path) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text("# a RocketMQ broker.conf\n! also a comment\nbrokerName = broker-b\n"
                    "transactionTimeOut=1000\ntransactionCheckMax: 3\nflushDiskType=SYNC_FLUSH\n"
                    "mappedFileSizeCommitLog=\\\n  1048576\nautoCreateTopicEnable=false\n"
                    "storePathRootDir=/data/rmq\nlistenPort=10921\nbrokerRole=ASYNC_MASTER\n\n")
    store, broker, server = load_broker_conf(conf)
    assert broker == {"broker_name": "broker-b", "transaction_timeout": 1000, "transaction_check_max": 3,
                      "auto_create_topic_enable": False}
    assert store == {"flush_disk_type": FlushDiskType.SYNC_FLUSH, "mapped_file_size_commit_log": 1048576,
                     "store_path_root_dir": "/data/rmq"}
    assert server == {"listen_port": 10921, "broker_role": "ASYNC_MASTER"}
    names = known_names()
    assert names["transactionTimeOut"] == ("broker", "transaction_timeout")
    assert "transactionTimeout" not in names
    assert names["maxHashSlotNum"] == ("store", "max_hash_slot_num")


@pytest.mark.parametrize(("line", "message"), [
    ("transactionTimeout=1000", "unknown setting 'transactionTimeout' (did you mean transactionTimeOut"),
    ("noSuchThing=1", "Known settings: "),
    ("transactionCheckMax=many", "transactionCheckMax must be an integer"),
    ("autoCreateTopicEnable=yes", "autoCreateTopicEnable must be true or false"),
    ("flushDiskType=SOMETIMES", "flushDiskType must be one of SYNC_FLUSH, ASYNC_FLUSH"),
    ("brokerRole=SLAVE", "replication to slaves is not built"),
    ("listenPort=70000", "listenPort must be within 0..65535"),
])
def test_bad_settings_are_refused_with_the_line_and_the_reason(tmp_path: Path, line: str, message: str) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text(f"brokerName=a\n{line}\n")
    with pytest.raises(BrokerConfigFileError) as e:
        load_broker_conf(conf)
    assert f"{conf}:2: " in str(e.value) and message in str(e.value)
    if "Known settings" in message:
        assert "transactionTimeOut" in str(e.value) and "flushDiskType" in str(e.value)


def test_serve_takes_the_settings_from_the_file(tmp_path: Path) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text(f"storePathRootDir={tmp_path / 'store'}\nmappedFileSizeCommitLog=262144\n"
                    "mappedFileSizeConsumeQueue=20000\nmaxHashSlotNum=1024\nmaxIndexNum=4096\n"
                    "transactionTimeOut=200\ntransactionCheckInterval=100\n")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "rmq_eventstore", "serve", "-c", str(conf), "--namesrv-port", "0",
                             "--broker-port", "0", "--log-level", "WARNING"], stdout=subprocess.PIPE, text=True,
                            env=env)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert f"serving {tmp_path / 'store'}" in line, line
        namesrv = line.rsplit(" ", 1)[1].strip()
        # a transaction left UNKNOWN is checked back after 200 ms, not RocketMQ's default 6 s + 30 s
        with TransactionProducer(namesrv, "app", lambda m: TransactionState.COMMIT) as p:
            p.send_in_transaction(Message("orders", b"x"), lambda m: TransactionState.UNKNOWN)
            deadline = time.monotonic() + 5
            found = False
            with PullConsumer(namesrv, "reader") as c:
                while not found and time.monotonic() < deadline:
                    found = any(c.pull("orders", q, 0, suspend_timeout_ms=0).status == FOUND for q in range(4))
                    time.sleep(0.05)
            assert found
        assert (tmp_path / "store" / "commitlog" / f"{0:020d}").stat().st_size == 262144
    finally:
        proc.terminate()
        proc.wait(30)


def test_serve_refuses_an_unknown_setting(tmp_path: Path) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text("listenPorts=10911\n")
    done = subprocess.run([sys.executable, "-m", "rmq_eventstore", "serve", "-c", str(conf), "--store",
                           str(tmp_path / "s")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "unknown setting 'listenPorts'" in done.stderr and not (tmp_path / "s").exists()
