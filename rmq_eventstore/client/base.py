"""What every client shares: the name-server address list, topic routes (cached 30 s), a client id,
heartbeats, and decoding of the record bodies the broker returns."""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ..common import MessageExt, codec
from ..common.fastjson import fastjson_loads
from ..common.rng import rng
from ..remoting import RemotingCommand, RequestCode, ResponseCode
from ..remoting.acl import SessionCredentials, sign_request
from .remoting_client import MQBrokerError, RemotingClient, RemotingError

ROUTE_TTL_SECONDS = 30.0
ROUTE_CACHE_SOFT_LIMIT = 1024  # past this many cached routes, those unused for ten TTLs are dropped
HEARTBEAT_INTERVAL_SECONDS = 30.0
DEFAULT_TIMEOUT = 3.0
_instance_counter = iter(range(1, 1 << 62))

log = logging.getLogger(__name__)


def credentials_of(access_key: str | None, secret_key: str | None) -> SessionCredentials | None:
    """ACL credentials from a client's keyword arguments: both keys or neither."""
    if access_key is None and secret_key is None:
        return None
    if not access_key or not secret_key:
        raise ValueError("ACL needs both access_key and secret_key")
    return SessionCredentials(access_key, secret_key)


def _local_ip() -> str:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))
            return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"


@dataclass
class TopicRoute:
    """A topic's route: its queues on each broker and each broker's master address."""

    topic: str
    queues: list[tuple[str, int]]  # (master address, queue id) of the writeable queues, broker by broker
    read_queues: list[tuple[str, int]]
    broker_addrs: dict[str, str]  # broker name -> master address
    fetched: float


def loads_body(body: bytes) -> Any:
    """A JSON response body; a Java name server writes fastjson with unquoted integer map keys
    (`"brokerAddrs":{0:"..."}`), which strict JSON rejects."""
    try:
        return json.loads(body)
    except ValueError:
        return fastjson_loads(body.decode("utf-8"))


def decode_records(body: bytes) -> list[MessageExt]:
    """The records of a pull or query body, in order (ZLIB bodies inflated, as Java's client does)."""
    return codec.decode_records(body, decompress=True)


class ClientBase:
    """Name-server lookups, route cache, heartbeats and the connection pool of one client instance."""

    def __init__(self, namesrv_addr: str, timeout: float = DEFAULT_TIMEOUT, access_key: str | None = None,
                 secret_key: str | None = None) -> None:
        addrs = [a.strip() for a in namesrv_addr.replace(",", ";").split(";") if a.strip()]
        if not addrs:
            raise ValueError("namesrv_addr is empty (expected 'host:port' or 'host:port;host:port')")
        self.namesrv_addrs = addrs
        self.timeout = timeout
        self.client_id = f"{_local_ip()}@{os.getpid()}#{next(_instance_counter)}"
        self.credentials = credentials_of(access_key, secret_key)
        sign = (lambda cmd, c=self.credentials: sign_request(cmd, c)) if self.credentials is not None else None
        self.remoting = RemotingClient(on_request=self._on_server_request, on_reconnect=self._on_reconnect,
                                       sign=sign)
        self._routes: dict[str, TopicRoute] = {}
        self._route_lock = threading.Lock()
        self._pinned: set[str] = set()  # brokers heartbeated whatever the routes say (see pin_cluster)
        self._extensions: dict[str, dict[str, Any]] = {}  # broker address -> rmq_eventstore extensions it serves
        self._stop = threading.Event()
        self._heartbeat_thread: threading.Thread | None = None
        self._started = False

    # -- lifecycle ---------------------------------------------------------------------------------------
    def start(self) -> None:
        if self._started:
            return
        self._started = True
        self._heartbeat_thread = threading.Thread(target=self._heartbeat_loop, name=f"heartbeat-{self.client_id}",
                                                  daemon=True)
        self._heartbeat_thread.start()

    def shutdown(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        try:
            self._unregister()
        except Exception:
            pass
        # connections first: a heartbeat waiting on a silent broker (a stalled network) is failed at once rather
        # than waited for (up to the timeout), and finds the client shut down for the brokers left
        self.remoting.close()
        if self._heartbeat_thread is not None and self._heartbeat_thread is not threading.current_thread():
            self._heartbeat_thread.join(timeout=5)

    def __enter__(self) -> Any:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def _on_reconnect(self, address: str) -> None:
        """A broker connection was lost and is made again (the broker restarted, say): announce ourselves
        at once rather than at the next heartbeat, so a restarted broker can reach our producer group for
        transaction check-backs and knows our consumers."""
        if address in self._known_brokers() and not self._stop.is_set():
            try:
                self.send_heartbeat([address])
            except Exception:
                log.debug("heartbeat after reconnecting to %s failed", address, exc_info=True)

    def _on_server_request(self, address: str, cmd: RemotingCommand) -> None:
        """Requests a broker sends us (NOTIFY_CONSUMER_IDS_CHANGED...): nothing to do for pull clients."""

    # -- heartbeats -------------------------------------------------------------------------------------
    def heartbeat_data(self) -> dict[str, Any]:
        return {"clientID": self.client_id, "producerDataSet": [], "consumerDataSet": []}

    def _known_brokers(self) -> set[str]:
        with self._route_lock:
            return {a for r in self._routes.values() for a in r.broker_addrs.values()} | self._pinned

    def pin_cluster(self) -> set[str]:
        """Heartbeat every master of the cluster from now on, not only those of the topics used so far: a
        transaction producer must be reachable by any broker holding one of its half messages, also right
        after it started in a process that has sent nothing yet (the check-back of a crashed sibling)."""
        r = self.invoke_namesrv(lambda: RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO))
        data = loads_body(r.body)
        addrs = set()
        for bd in (data.get("brokerAddrTable") or {}).values():
            master = (bd.get("brokerAddrs") or {}).get("0", (bd.get("brokerAddrs") or {}).get(0))
            if master:
                addrs.add(master)
        with self._route_lock:
            self._pinned |= addrs
        self.send_heartbeat(addrs)
        return addrs

    def send_heartbeat(self, addresses: Iterable[str] | None = None) -> None:
        body = json.dumps(self.heartbeat_data()).encode()
        for addr in addresses if addresses is not None else self._known_brokers():
            try:
                r = self.remoting.invoke(addr, RemotingCommand.request(RequestCode.HEART_BEAT, body=body), self.timeout)
                if r.code != ResponseCode.SUCCESS:
                    raise MQBrokerError(r.code, r.remark, addr)
            except RemotingError:
                continue

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(HEARTBEAT_INTERVAL_SECONDS):
            try:
                self.send_heartbeat()
            except Exception:
                pass

    def _unregister(self) -> None:
        pass

    # -- invoking -----------------------------------------------------------------------------------------
    def invoke(self, address: str, cmd: RemotingCommand, timeout: float | None = None,
               ok: tuple[int, ...] = (ResponseCode.SUCCESS,),
               while_waiting: Callable[[], None] | None = None) -> RemotingCommand:
        """Send a request; a response code outside `ok` raises `MQBrokerError`. `while_waiting`: see
        `ClientConnection.invoke`."""
        r = self.remoting.invoke(address, cmd, self.timeout if timeout is None else timeout, while_waiting)
        if r.code not in ok:
            raise MQBrokerError(r.code, r.remark, address)
        return r

    def invoke_namesrv(self, cmd_factory: Any, ok: tuple[int, ...] = (ResponseCode.SUCCESS,)) -> RemotingCommand:
        last: Exception | None = None
        for addr in rng.sample(self.namesrv_addrs, len(self.namesrv_addrs)):
            try:
                return self.invoke(addr, cmd_factory(), ok=ok)
            except RemotingError as e:
                last = e
        raise RemotingError(f"no name server reachable ({', '.join(self.namesrv_addrs)}): {last}")

    # -- routes -------------------------------------------------------------------------------------------
    def forget_route(self, topic: str) -> None:
        """Drop the cached route of `topic` (deleted): the next use asks the name server again."""
        with self._route_lock:
            self._routes.pop(topic, None)

    def _evict_routes(self) -> None:
        """Bound the route cache of a client that sends to many short-lived topics (Celery's reply queues):
        routes nobody asked for in ten TTLs go; the brokers of the others stay known for heartbeats."""
        old = time.monotonic() - 10 * ROUTE_TTL_SECONDS
        with self._route_lock:
            for t in [t for t, r in self._routes.items() if r.fetched < old]:
                del self._routes[t]

    def route(self, topic: str, refresh: bool = False) -> TopicRoute:
        r = self._routes.get(topic)
        if r is not None and not refresh and time.monotonic() - r.fetched < ROUTE_TTL_SECONDS:
            return r
        resp = self.invoke_namesrv(lambda: RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC,
                                                                   {"topic": topic}))
        data = loads_body(resp.body)
        brokers = {}
        for bd in data.get("brokerDatas") or []:
            addrs = bd.get("brokerAddrs") or {}
            master = addrs.get("0", addrs.get(0))
            if master:
                brokers[bd["brokerName"]] = master
        queues, read_queues = [], []
        for qd in sorted(data.get("queueDatas") or [], key=lambda q: q["brokerName"]):
            addr = brokers.get(qd["brokerName"])
            if addr is None:
                continue
            perm = int(qd.get("perm", 6))
            if perm & 2:
                queues += [(addr, i) for i in range(int(qd.get("writeQueueNums", 0)))]
            if perm & 4:
                read_queues += [(addr, i) for i in range(int(qd.get("readQueueNums", 0)))]
        r = TopicRoute(topic, queues, read_queues, brokers, time.monotonic())
        if len(self._routes) >= ROUTE_CACHE_SOFT_LIMIT and topic not in self._routes:
            self._evict_routes()
        with self._route_lock:
            new_brokers = set(brokers.values()) - {a for x in self._routes.values() for a in x.broker_addrs.values()}
            self._routes[topic] = r
        if new_brokers:
            self.send_heartbeat(new_brokers)
        return r

    def supports(self, address: str, extension: str) -> bool:
        """Whether the broker at `address` serves one of rmq_eventstore's extensions (GET_BROKER_EXTENSIONS,
        asked once per broker and cached; an Apache RocketMQ broker answers REQUEST_CODE_NOT_SUPPORTED)."""
        with self._route_lock:
            known = self._extensions.get(address)
        if known is None:
            r = self.remoting.invoke(address, RemotingCommand.request(RequestCode.GET_BROKER_EXTENSIONS, {}),
                                     self.timeout)
            known = dict(json.loads(r.body or b"{}").get("extensions") or {}) if r.code == ResponseCode.SUCCESS else {}
            with self._route_lock:
                self._extensions[address] = known
        return bool(known.get(extension))

    def broker_for(self, topic: str) -> str:
        """The master address of the (first) broker serving `topic`."""
        r = self.route(topic)
        if not r.broker_addrs:
            raise RemotingError(f"no broker serves topic {topic!r}")
        return next(iter(r.broker_addrs.values()))
