#!/usr/bin/env python3
"""The broker's END_TRANSACTION in ONE process, without sockets: thread CPU per END (COMMIT) of a half message
stored just before, as a Django append does (half message, then its end). The half messages are put through
the store as the send processor puts them (`TransactionalMessageService.prepare`); the END goes through
`EndTransactionProcessor.process` with the header our `TransactionProducer` sends.

    python benchmarks/profile_end_inproc.py [--n N] [--cprofile]

A profiling tool, not a benchmark: nothing here is compared with a peer.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from rmq_eventstore.broker import Broker  # noqa: E402
from rmq_eventstore.broker.processor.end_transaction import EndTransactionProcessor  # noqa: E402
from rmq_eventstore.common import Message, codec  # noqa: E402
from rmq_eventstore.common.message_id import UniqueIdGenerator  # noqa: E402
from rmq_eventstore.remoting import RemotingCommand, RequestCode, ResponseCode  # noqa: E402
from rmq_eventstore.store import MessageStore  # noqa: E402


def run(n: int, prof: cProfile.Profile | None) -> float:
    tmp = tempfile.mkdtemp(prefix="end-inproc-")
    ids = UniqueIdGenerator()
    try:
        with MessageStore.open(Path(tmp) / "s") as store:
            b = Broker(store)
            b.start()
            try:
                b.topic_manager.ensure("Tx", 4)
                service, end = b.transaction_service, EndTransactionProcessor(b)
                spent = 0.0
                for i in range(n):
                    uniq = ids.create()
                    msg = Message("Tx", b"x" * 200, tags="t", queue_id=i & 3)
                    msg.properties_string = (f"UNIQ_KEY\x01{uniq}\x02TRAN_MSG\x01true\x02PGROUP\x01g\x02"
                                             f"TAGS\x01t\x02WAIT\x01true\x02")
                    msg.sys_flag = codec.TRANSACTION_PREPARED_TYPE
                    service.prepare(msg)
                    r = store.put_message(msg)
                    assert r.is_ok(), r.status
                    cmd = RemotingCommand.request(RequestCode.END_TRANSACTION, {
                        "topic": "Tx", "producerGroup": "g", "tranStateTableOffset": r.append_result.logics_offset,
                        "commitLogOffset": r.append_result.wrote_offset,
                        "commitOrRollback": codec.TRANSACTION_COMMIT_TYPE, "fromTransactionCheck": False,
                        "msgId": uniq, "transactionId": uniq}, oneway=True)
                    store.reput_message_service.wait_for(store.get_max_phy_offset(), 5.0)  # as on the loop
                    if prof is not None:
                        prof.enable()
                    t0 = time.thread_time()
                    resp = end.process(cmd, None, wait=False)
                    spent += time.thread_time() - t0
                    if prof is not None:
                        prof.disable()
                    assert resp is not None and resp.code == ResponseCode.SUCCESS, resp
            finally:
                b.shutdown()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return spent / n * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cprofile", action="store_true")
    args = ap.parse_args()
    prof = cProfile.Profile(time.thread_time) if args.cprofile else None
    best = min(run(args.n, prof) for _ in range(args.rounds))
    print(f"END_TRANSACTION COMMIT: {best:.1f} us thread CPU each (best of {args.rounds}, no sockets)")
    if prof is not None:
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats(os.environ.get("PROFILE_SORT", "tottime")).print_stats(
            int(os.environ.get("PROFILE_TOP", "30")))
        print("\n".join(ln for ln in s.getvalue().splitlines() if ln.strip()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
