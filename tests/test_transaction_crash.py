"""Transactions across broker crashes: a producer runs transactions (commit, rollback, and UNKNOWN settled by
the check-back) while the broker process (`rmq-eventstore serve`, SYNC_FLUSH) is killed with SIGKILL at random
instants and restarted on the same ports. At the end every transaction whose half message was stored is
committed exactly once or rolled back: never both, never twice, none lost.

`TX_CRASH_ROUNDS` (default 10) sets the number of kills, `TX_CRASH_SEED` reproduces a run.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from brokertools import pull_all

from rmq_eventstore.client import (
    Admin,
    Message,
    MessageExt,
    MQBrokerError,
    RemotingError,
    TransactionProducer,
    TransactionState,
)
from rmq_eventstore.common.topic import RMQ_SYS_TRANS_HALF_TOPIC

ROUNDS = int(os.environ.get("TX_CRASH_ROUNDS", "10"))
SEED = int(os.environ.get("TX_CRASH_SEED", str(random.randrange(1 << 30))))
TOPIC = "ledger"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def decision(key: str) -> str:
    """What the application decides for transaction `key`: commit, rollback, or commit known only later."""
    return ("commit", "rollback", "late-commit")[int(key.split("-")[1]) % 3]


def execute(msg: Message) -> TransactionState:
    d = decision(str(msg.keys))
    if d == "commit":
        return TransactionState.COMMIT
    if d == "rollback":
        return TransactionState.ROLLBACK
    return TransactionState.UNKNOWN  # the database committed but the process could not say so


def checker(msg: MessageExt) -> TransactionState:
    return TransactionState.ROLLBACK if decision(msg.keys or "") == "rollback" else TransactionState.COMMIT


class Broker:
    """The broker as a separate process, killed and restarted on the same ports."""

    def __init__(self, tmp: Path) -> None:
        self.conf = tmp / "broker.conf"
        self.conf.write_text(f"storePathRootDir={tmp / 'store'}\nflushDiskType=SYNC_FLUSH\n"
                             "mappedFileSizeCommitLog=65536\nmappedFileSizeConsumeQueue=2000\n"
                             "maxHashSlotNum=512\nmaxIndexNum=2048\n"
                             "transactionTimeOut=300\ntransactionCheckInterval=150\n")
        self.ports = (free_port(), free_port())
        self.proc: subprocess.Popen | None = None
        self.namesrv = f"127.0.0.1:{self.ports[0]}"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rmq_eventstore", "serve", "-c", str(self.conf), "--namesrv-port",
             str(self.ports[0]), "--broker-port", str(self.ports[1]), "--log-level", "ERROR"],
            stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert "serving" in line, line

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)


def visible_counts(namesrv: str) -> Counter:
    return Counter(m.keys for m in pull_all(namesrv, TOPIC, "auditor"))


def test_every_transaction_ends_once_across_broker_kills(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    broker = Broker(tmp_path)
    attempted: list[str] = []
    stop = threading.Event()
    broker.start()
    producer = TransactionProducer(broker.namesrv, "ledger-app", checker, send_timeout_ms=1000,
                                   retry_times_when_send_failed=0).start()

    def run() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            key = f"t-{n}"
            attempted.append(key)
            try:
                producer.send_in_transaction(Message(TOPIC, key.encode(), keys=key), execute)
            except (RemotingError, MQBrokerError):
                time.sleep(0.05)  # the broker is down: try the next one

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    try:
        for _ in range(ROUNDS):
            time.sleep(rng.uniform(0.2, 1.2))
            broker.kill()
            time.sleep(rng.uniform(0.0, 0.3))
            broker.start()
        time.sleep(0.5)
        stop.set()
        worker.join(30)
        admin = Admin(broker.namesrv)
        stored = {k for k in attempted if admin.query_message(RMQ_SYS_TRANS_HALF_TOPIC, k)}
        expected = {k for k in stored if decision(k) != "rollback"}
        deadline = time.monotonic() + 60
        counts = visible_counts(broker.namesrv)
        while set(counts) != expected and time.monotonic() < deadline:
            time.sleep(0.3)
            counts = visible_counts(broker.namesrv)
        twice = {k: c for k, c in counts.items() if c > 1}
        rolled_back_but_visible = {k for k in counts if decision(k) == "rollback"}
        unstored_but_visible = set(counts) - stored
        missing = expected - set(counts)
        print(f"seed {SEED}: {ROUNDS} kills, {len(attempted)} transactions tried, {len(stored)} half messages "
              f"stored, {len(expected)} committed")
        assert not twice, f"committed more than once (seed {SEED}): {twice}"
        assert not rolled_back_but_visible, f"rolled back yet visible (seed {SEED}): {rolled_back_but_visible}"
        assert not unstored_but_visible, f"visible without a half message (seed {SEED}): {unstored_but_visible}"
        assert not missing, f"committed transactions lost (seed {SEED}): {sorted(missing)[:20]}"
        assert len(stored) >= ROUNDS  # the run did transactions in every round
    finally:
        stop.set()
        producer.shutdown()
        broker.stop()
