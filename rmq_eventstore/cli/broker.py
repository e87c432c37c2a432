"""`rmq-eventstore serve --store PATH`: run the broker and its name server in the foreground.

Listens on 127.0.0.1 by default (name server 9876, broker 10911, RocketMQ's ports; 0 = a free port).
Once serving, the broker announces itself in `<store>/broker.json` (pid and the real addresses) so that
other processes find it. SIGTERM or SIGINT is a clean shutdown: the announcement is removed, connections
are closed, consumer and delay offsets persisted, the store flushed and its `abort` file removed.
`--idle-exit SECONDS` is the same clean shutdown once no client connection has been open for that long
(brokers started on demand by `rmq_eventstore.client.ensure_local_broker` use it).
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import signal
import sys
import threading

from ..broker.config_file import BrokerConfigFileError, load_broker_conf
from ..broker.server import serve_in_thread
from ..store import StoreLockedError
from .output import EXIT_ERROR, EXIT_OK, CliError, Command


def configure_serve(p: argparse.ArgumentParser) -> None:
    p.add_argument("-c", "--config", metavar="FILE",
                   help="a RocketMQ broker.conf (properties with RocketMQ's names, e.g. transactionTimeOut=1000); "
                        "options given here win over it")
    p.add_argument("--store", default=None, metavar="PATH",
                   help="store directory (default: storePathRootDir of --config, else ./var/store)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    p.add_argument("--namesrv-port", type=int, default=9876, help="name server port (default: 9876; 0: a free port)")
    p.add_argument("--broker-port", type=int, default=None,
                   help="broker port (default: listenPort of --config, else 10911; 0: a free port)")
    p.add_argument("--idle-exit", type=float, default=None, metavar="SECONDS",
                   help="shut down cleanly once no client connection has been open for SECONDS (default: never)")
    p.add_argument("--flush-disk-type", choices=("ASYNC_FLUSH", "SYNC_FLUSH"), default=None,
                   help="SYNC_FLUSH answers a send only after its bytes are fsynced")
    p.add_argument("--no-auto-create-topic", action="store_true",
                   help="refuse sends to topics not created first (UPDATE_AND_CREATE_TOPIC)")
    p.add_argument("--message-delay-level", default=None, metavar="LEVELS",
                   help='delay levels, default "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"')
    p.add_argument("--acl", metavar="PLAIN_ACL_YML", default=None,
                   help="enforce RocketMQ's ACL 1.0 from this plain_acl.yml (also: aclEnable=true in --config)")
    p.add_argument("--event-loop", choices=("auto", "uvloop", "asyncio"), default=None,
                   help="the server's event loop: uvloop when installed (auto, the default; also "
                        "RMQ_EVENTSTORE_EVENT_LOOP), or asyncio's own")
    p.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


def run_serve(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config: dict[str, object] = {}
    server_conf: dict[str, object] = {}
    if args.config:
        try:
            store_conf, broker_conf, server_conf = load_broker_conf(args.config)
        except BrokerConfigFileError as e:
            raise CliError(str(e), EXIT_ERROR) from None
        config.update(store_conf)
        config.update(broker_conf)
    broker_port = args.broker_port if args.broker_port is not None else int(server_conf.get("listen_port", 10911))
    store_path = args.store or config.pop("store_path_root_dir", None) or "var/store"
    config.pop("store_path_root_dir", None)
    if args.flush_disk_type:
        config["flush_disk_type"] = args.flush_disk_type
    if args.no_auto_create_topic:
        config["auto_create_topic_enable"] = False
    if args.message_delay_level:
        config["message_delay_level"] = args.message_delay_level
    if args.acl:
        config["acl_enable"] = True
        config["acl_file"] = args.acl
    if not config.get("acl_enable") and not _is_loopback(args.host):
        logging.getLogger("rmq_eventstore.serve").warning(
            "listening on %s beyond loopback WITHOUT access control: anyone who reaches it can read and write "
            "every topic; give --acl plain_acl.yml (or aclEnable=true) or listen on 127.0.0.1", args.host)
    if args.event_loop:
        config["event_loop"] = args.event_loop
    if args.idle_exit is not None and args.idle_exit <= 0:
        raise CliError("--idle-exit must be a positive number of seconds", EXIT_ERROR)
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        try:
            running = serve_in_thread(store_path, args.host, args.namesrv_port, broker_port, **config)
        except StoreLockedError as e:
            raise CliError(str(e), EXIT_ERROR) from None
        except OSError as e:
            raise CliError(f"cannot listen on {args.host}: {e.strerror or e}", EXIT_ERROR) from None
        with running:
            print(f"broker {running.broker_address} serving {store_path}; name server {running.namesrv_address}",
                  flush=True)
            tick = 0.5 if args.idle_exit is None else min(0.5, args.idle_exit / 4)
            while not stop.wait(tick):
                if args.idle_exit is not None and running.server.idle_seconds() >= args.idle_exit:
                    print(f"no client connection for {args.idle_exit:g} s (--idle-exit)", flush=True)
                    break
            print("shutting down", flush=True)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return EXIT_OK


COMMANDS: list[Command] = [
    Command("serve", "run the broker (remoting protocol) and its name server on a store", configure_serve,
            run_serve, __doc__.split("\n\n")[0] if __doc__ else "", takes_path=False, writes=True),
]
