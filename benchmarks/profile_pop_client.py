#!/usr/bin/env python3
"""CPU per message of POP + ACK on BOTH ends: this client process (`PopConsumer`, `time.process_time`, every
thread) and the broker's threads (`pthread_getcpuclockid`, the child of profile_broker.py), for batch sizes
given on the command line; optionally the client's cProfile (its requests are read on the caller's thread,
so the main thread sees all of its work).

    python benchmarks/profile_pop_client.py [32 1 ...] [--n N] [--rounds R] [--piped] [--cprofile]

Each round starts a fresh broker child, fills a topic with N messages of 200 bytes, and pops + acks them
(`pop(max_nums=B)` + `ack_batch`, or with `--piped` the ack riding on the next pop). Medians of the rounds.
A profiling tool, not a benchmark: nothing here is compared with a peer.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.profile_broker import Child  # noqa: E402


def one_round(batch: int, n: int, piped: bool, prof: cProfile.Profile | None) -> dict:
    from rmq_eventstore.client import Message, PopConsumer, Producer

    child = Child(Path(tempfile.gettempdir()), False, None)
    try:
        with Producer(child.namesrv, "profile-producer") as p:
            for i in range(0, n, 100):
                p.send_batch([Message("PopC", b"x" * 200)] * min(100, n - i), queue_id=0)
        time.sleep(0.3)
        with PopConsumer(child.namesrv, "profile-pop") as c:
            c.pop("PopC", max_nums=1, invisible_time=60_000)  # routes, connection (one message left unacked)
            child.ask("start")
            t, c0 = time.perf_counter(), time.process_time()
            if prof is not None:
                prof.enable()
            got, prev = 1, None
            while got < n:
                if piped:
                    popped = c.pop("PopC", max_nums=batch, invisible_time=60_000, poll_time=1000, ack=prev)
                    prev = popped
                else:
                    popped = c.pop("PopC", max_nums=batch, invisible_time=60_000, poll_time=1000)
                    c.ack_batch(popped)
                got += len(popped)
            if piped and prev:
                c.ack_batch(prev)
            if prof is not None:
                prof.disable()
            client, wall = time.process_time() - c0, time.perf_counter() - t
            res = json.loads(child.ask("stop"))
    finally:
        child.close()
    broker = sum(v for k, v in res["threads"].items() if k.startswith("broker"))
    m = n - 1
    return {"rate": m / wall, "client_us": client / m * 1e6, "broker_us": broker / m * 1e6,
            "broker_all_us": sum(res["threads"].values()) / m * 1e6}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("batches", nargs="*", type=int, default=[32, 1])
    ap.add_argument("--n", type=int, default=8000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--piped", action="store_true")
    ap.add_argument("--cprofile", action="store_true", help="print the client's top functions (own time)")
    args = ap.parse_args()
    with open("/proc/loadavg") as f:
        print("load average:", " ".join(f.read().split()[:3]))
    for b in args.batches:
        prof = cProfile.Profile() if args.cprofile else None
        rows = [one_round(b, args.n, args.piped, prof) for _ in range(args.rounds)]
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        print(f"batch {b:3d}{' piped' if args.piped else ''}: {med['rate']:9,.0f} msgs/s   client "
              f"{med['client_us']:6.2f} us/msg   broker loop {med['broker_us']:6.2f} us/msg   broker all "
              f"{med['broker_all_us']:6.2f} us/msg   (medians of {args.rounds})")
        if prof is not None:
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(22)
            print("\n".join(ln for ln in s.getvalue().splitlines() if ln.strip())[-4000:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
