"""Many processes, one local store: find the broker process that owns a store directory, or start one.

A store has one owner process (its `lock` file, held by the `MessageStore`), as in RocketMQ, where one
broker writes its store. Django web workers, Celery workers and scripts that want `file:///srv/var/store`
therefore talk to the owner's broker over loopback, with the ordinary clients (`Producer`,
`PullConsumer`, `Admin`, ...), which take its name-server address.

- The owner announces itself in `<store>/broker.json` (`common/broker_file.py`): pid, name-server and
  broker addresses. `find_local_broker` trusts it only when that pid is alive and its name server answers
  GET_BROKER_CLUSTER_INFO naming the announced broker.
- `ensure_local_broker` finds one, or starts `python -m rmq_eventstore serve --store PATH --namesrv-port 0
  --broker-port 0 --idle-exit N` detached (own session, output appended to `<store>/logs/broker.log`).
  It decides under an exclusive `flock` of `<store>/broker.spawn.lock`, so concurrent callers, threads
  or processes, start at most one broker; the others wait on the lock and then find it.
- A broker started this way exits cleanly once no client connection has been open for `idle_exit`
  seconds; the next `ensure_local_broker` starts a new one. Call `resolve_namesrv` (cheap: a file read
  and one request) when you create clients rather than keeping an address for a long time.

This module is client-side: it imports neither the store nor the broker.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from ..common.broker_file import BROKER_FILE, broker_file_path, read_broker_file
from ..remoting import RemotingCommand, RequestCode, ResponseCode
from .base import loads_body
from .remoting_client import RemotingClient, RemotingError

DEFAULT_NAMESRV_PORT = 9876
DEFAULT_IDLE_EXIT = 300.0
PROBE_TIMEOUT = 2.0
SPAWN_LOCK_FILE = "broker.spawn.lock"
SPAWN_CONF_FILE = "broker.spawn.conf"
LOG_DIR = "logs"
LOG_FILE = "broker.log"
LOG_ROTATE_BYTES = 10 * 1024 * 1024
_LOCKED_GRACE = 2.0  # the store is locked by someone else: how long to wait for its broker to announce
_SPECIAL_NAMES = {"transaction_timeout": "transactionTimeOut"}  # RocketMQ names plain camelCase misses

_spawned: dict[int, subprocess.Popen] = {}  # brokers this process started, reaped by a waiter thread
os.register_at_fork(after_in_child=_spawned.clear)  # a forked worker is not their parent


class LocalBrokerError(RuntimeError):
    """No broker could be found or started for a local store; the message says why (and shows the end of
    `<store>/logs/broker.log` when a broker we started failed)."""


@dataclass(frozen=True)
class LocalBroker:
    """The broker that serves a local store: its pid, addresses, and whether this call started it."""

    store_path: str
    pid: int
    namesrv_addr: str
    broker_addr: str
    started_by_us: bool


# -- URLs -------------------------------------------------------------------------------------------------
def parse_url(url: str) -> tuple[str, str]:
    """("file", absolute store path) for `file:///abs/path` or `rocketmq:///abs/path` (kombu style, no
    host); ("namesrv", "host:port") for `rmq://host[:port]` or `rocketmq://host[:port]` (port 9876 by
    default). Anything else raises ValueError saying what is expected."""
    if not isinstance(url, str) or not url.strip():
        raise ValueError("a store URL must be a non-empty string such as 'file:///srv/app/var/store' or "
                         "'rmq://127.0.0.1:9876'")
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    if scheme == "file" or (scheme == "rocketmq" and not parts.netloc):
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"URL {url!r} names a host ({parts.netloc!r}); a local store is "
                             f"{scheme}:///absolute/path (three slashes)")
        if parts.query or parts.fragment:
            raise ValueError(f"URL {url!r} has a query or fragment; a local store is {scheme}:///absolute/path")
        path = unquote(parts.path)
        if not path or not os.path.isabs(path):
            raise ValueError(f"URL {url!r} needs an absolute path, e.g. {scheme}:///srv/app/var/store")
        return "file", os.path.normpath(path)
    if scheme in ("rmq", "rocketmq"):
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise ValueError(f"URL {url!r}: a name server is {scheme}://host:port with nothing after it "
                             f"(a local store is {scheme}:///absolute/path)" if scheme == "rocketmq" else
                             f"URL {url!r}: a name server is rmq://host:port with nothing after it")
        if parts.username or parts.password:
            raise ValueError(f"URL {url!r} carries credentials; pass access_key/secret_key to the clients")
        try:
            port = parts.port
        except ValueError:
            raise ValueError(f"URL {url!r} has an invalid port (expected 1..65535)") from None
        if port == 0:
            raise ValueError(f"URL {url!r} has an invalid port (expected 1..65535)")
        host = parts.hostname
        if not host:
            raise ValueError(f"URL {url!r} names no host; a name server is {scheme}://host:9876")
        host = f"[{host}]" if ":" in host else host
        return "namesrv", f"{host}:{port or DEFAULT_NAMESRV_PORT}"
    if not parts.scheme:
        raise ValueError(f"URL {url!r} has no scheme; use file:///path/to/store for a local store or "
                         "rmq://host:9876 for a name server")
    raise ValueError(f"URL {url!r} has scheme {parts.scheme!r}; use file:///path/to/store (or "
                     "rocketmq:///path/to/store) for a local store, rmq://host:9876 (or rocketmq://host:9876) "
                     "for a name server")


# -- processes --------------------------------------------------------------------------------------------
def _pid_alive(pid: int) -> bool:
    """Whether `pid` runs. A zombie does not (seen in /proc); a broker we started is reaped by its waiter
    thread, never by a `waitpid` here, which could steal another `Popen`'s child."""
    if pid <= 0:
        return False
    proc = _spawned.get(pid)
    if proc is not None and proc.returncode is not None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, belongs to someone else
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return stat[stat.rindex(b")") + 2:stat.rindex(b")") + 3] != b"Z"
    except (OSError, ValueError):
        return True


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _lock_holder(store_path: str) -> int | None:
    """The pid holding the store's `lock` file, from /proc/locks (Linux), if it can be told."""
    try:
        ino = os.stat(os.path.join(store_path, "lock")).st_ino
        with open("/proc/locks") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    found: list[tuple[str, int]] = []
    for line in lines:
        fields = line.split()
        if "->" in fields:  # a waiter, not a holder
            continue
        try:
            kind, pid, dev_ino = fields[1], int(fields[4]), fields[5]
        except (IndexError, ValueError):
            continue
        if dev_ino.rsplit(":", 1)[-1] == str(ino):
            found.append((kind, pid))
    for _kind, pid in sorted(found, key=lambda kp: kp[0] != "POSIX"):  # POSIX locks carry the right pid
        if pid > 0:
            return pid
    return None


# -- finding ----------------------------------------------------------------------------------------------
def _probe(namesrv: str, broker: str, timeout: float) -> bool:
    """Whether the name server at `namesrv` answers GET_BROKER_CLUSTER_INFO and knows `broker`."""
    client = RemotingClient(connect_timeout=timeout)
    try:
        r = client.invoke(namesrv, RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO), timeout)
        if r.code != ResponseCode.SUCCESS:
            return False
        table = (loads_body(r.body) or {}).get("brokerAddrTable") or {}
        return any(broker in (bd.get("brokerAddrs") or {}).values() for bd in table.values())
    except (RemotingError, OSError, ValueError, AttributeError):
        return False
    finally:
        client.close()


def _store_path(store_path: str | os.PathLike[str]) -> str:
    return os.path.abspath(os.fspath(store_path))


def find_local_broker(store_path: str | os.PathLike[str], *, probe_timeout: float = PROBE_TIMEOUT
                      ) -> LocalBroker | None:
    """The broker announced in `<store>/broker.json`, if its pid is alive and its name server answers a
    real request naming it; else None. A stale file is left alone (a new broker replaces it)."""
    path = _store_path(store_path)
    data = read_broker_file(path)
    if data is None or not _pid_alive(data["pid"]):
        return None
    if not _probe(data["namesrv"], data["broker"], probe_timeout):
        return None
    return LocalBroker(path, data["pid"], data["namesrv"], data["broker"], False)


# -- starting ---------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _spawn_lock(store_path: str, deadline: float) -> Iterator[None]:
    """An exclusive flock of `<store>/broker.spawn.lock` (conflicts between threads too: each open is its
    own open file description)."""
    lock_path = os.path.join(store_path, SPAWN_LOCK_FILE)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise LocalBrokerError(f"timed out waiting for {lock_path} (another process is starting "
                                           "the store's broker and has not finished)") from None
                time.sleep(0.02)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _conf_name(key: str) -> str:
    if key in _SPECIAL_NAMES:
        return _SPECIAL_NAMES[key]
    head, *rest = key.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def _conf_value(key: str, value: Any) -> str:
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif hasattr(value, "name") and hasattr(type(value), "__members__"):  # an Enum such as FlushDiskType
        text = value.name
    else:
        text = str(value)
    if "\n" in text or "\r" in text or text.endswith("\\"):
        raise ValueError(f"broker option {key!r}: a value cannot hold a line break or end with a backslash")
    return text


def _write_spawn_conf(store_path: str, options: dict[str, Any]) -> str:
    lines = ["# written by rmq_eventstore.client.ensure_local_broker for the broker it starts"]
    for key, value in options.items():
        if not isinstance(key, str) or not key:
            raise ValueError(f"broker option names are strings, not {key!r}")
        lines.append(f"{_conf_name(key)}={_conf_value(key, value)}")
    conf = os.path.join(store_path, SPAWN_CONF_FILE)
    tmp = conf + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(tmp, conf)
    return conf


def _log_tail(log_path: str, start: int, max_lines: int = 25) -> str:
    try:
        with open(log_path, "rb") as f:
            f.seek(start)
            text = f.read()[-16384:].decode(errors="replace")
    except OSError:
        return ""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return "\n".join("    " + ln for ln in lines[-max_lines:])


def _package_root() -> str:
    """The directory that holds the `rmq_eventstore` package this process runs, so that the broker we
    start runs the same code."""
    return str(Path(__file__).resolve().parents[2])


def _reap(proc: subprocess.Popen) -> None:
    try:
        proc.wait()
    finally:
        _spawned.pop(proc.pid, None)


def _spawn(store_path: str, idle_exit: float | None, broker_options: dict[str, Any] | None,
           python: str) -> tuple[subprocess.Popen, str, int]:
    log_dir = os.path.join(store_path, LOG_DIR)
    os.makedirs(log_dir, exist_ok=True)
    log_path = os.path.join(log_dir, LOG_FILE)
    with contextlib.suppress(OSError):
        if os.path.getsize(log_path) > LOG_ROTATE_BYTES:
            os.replace(log_path, log_path + ".1")
    cmd = [python, "-m", "rmq_eventstore", "serve", "--store", store_path, "--host", "127.0.0.1",
           "--namesrv-port", "0", "--broker-port", "0"]
    if idle_exit is not None:
        cmd += ["--idle-exit", repr(float(idle_exit))]
    if broker_options:
        cmd += ["-c", _write_spawn_conf(store_path, broker_options)]
    env = dict(os.environ)
    root = _package_root()
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.setdefault("PYTHONUNBUFFERED", "1")
    with open(log_path, "ab") as log:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        log.write(f"--- {stamp} pid {os.getpid()} starts: {' '.join(cmd)}\n".encode())
        log.flush()
        start_of_run = log.tell()
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=store_path, env=env,
                                start_new_session=True, close_fds=True)
    _spawned[proc.pid] = proc
    threading.Thread(target=_reap, args=(proc,), name=f"rmq-broker-reaper-{proc.pid}", daemon=True).start()
    return proc, log_path, start_of_run


def _remove_stale_file(store_path: str) -> None:
    """Remove a broker.json whose pid is dead (provably stale); a replaced file (new inode) is kept."""
    path = broker_file_path(store_path)
    try:
        ino = os.stat(path).st_ino
    except OSError:
        return
    data = read_broker_file(store_path)
    if data is not None and _pid_alive(data["pid"]):
        return
    with contextlib.suppress(OSError):
        if os.stat(path).st_ino == ino:
            os.unlink(path)


def _describe_holder(store_path: str) -> str:
    pid = _lock_holder(store_path)
    if pid is None:
        return "another process holds its lock file (which one cannot be told here)"
    if pid == os.getpid():
        return (f"this very process (pid {pid}) holds its lock file: the store is open here without a broker "
                "that announced itself (serve_in_thread announces; a bare MessageStore does not)")
    cmd = _cmdline(pid)
    return f"pid {pid}{f' ({cmd})' if cmd else ''} holds its lock file and announces no broker in {BROKER_FILE}"


def ensure_local_broker(store_path: str | os.PathLike[str], *, timeout: float = 30.0,
                        idle_exit: float | None = DEFAULT_IDLE_EXIT, broker_options: dict[str, Any] | None = None,
                        python: str = sys.executable) -> LocalBroker:
    """The broker serving the store at `store_path`: found (`find_local_broker`), or started.

    Creates the directory if needed. Deciding happens under an exclusive flock of
    `<store>/broker.spawn.lock`, so of many concurrent callers (threads or processes) at most one starts a
    broker: `python -m rmq_eventstore serve --store PATH --namesrv-port 0 --broker-port 0 --idle-exit N`,
    in its own session, output appended to `<store>/logs/broker.log`. `broker_options` are StoreConfig /
    BrokerConfig settings by our names (`flush_disk_type`) or RocketMQ's (`flushDiskType`), handed to
    `serve -c`; they apply only when a broker is started here. `idle_exit=None` starts a broker that never
    exits on its own. `python` is the interpreter to run it (under uWSGI, say, `sys.executable` is not
    Python: pass it). Raises `LocalBrokerError` (with the end of the log) when no broker comes up within
    `timeout` seconds, e.g. because another process holds the store without announcing a broker.
    """
    path = _store_path(store_path)
    found = find_local_broker(path)
    if found is not None:
        return found
    if idle_exit is not None and idle_exit <= 0:
        raise ValueError("idle_exit must be a positive number of seconds, or None for never")
    deadline = time.monotonic() + timeout
    with contextlib.ExitStack() as stack:
        try:
            os.makedirs(path, exist_ok=True)
            if not os.access(path, os.W_OK | os.X_OK):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
            stack.enter_context(_spawn_lock(path, deadline))
        except OSError as e:
            raise LocalBrokerError(f"cannot use {path} as a store directory: {e.strerror or e} "
                                   f"({type(e).__name__}); it must be a directory this process can write") from None
        found = find_local_broker(path)
        if found is not None:
            return found
        _remove_stale_file(path)
        try:
            proc, log_path, log_start = _spawn(path, idle_exit, broker_options, python)
        except OSError as e:
            raise LocalBrokerError(f"cannot start a broker for {path} with {python}: {e.strerror or e}") from None
        return _wait_for(path, proc, log_path, log_start, deadline, timeout)
    raise AssertionError("unreachable")  # pragma: no cover


def _wait_for(path: str, proc: subprocess.Popen, log_path: str, log_start: int, deadline: float,
              timeout: float) -> LocalBroker:
    while True:
        data = read_broker_file(path)
        if data is not None and data["pid"] == proc.pid and _probe(data["namesrv"], data["broker"], PROBE_TIMEOUT):
            return LocalBroker(path, proc.pid, data["namesrv"], data["broker"], True)
        code = proc.poll()
        if code is not None:
            break
        if time.monotonic() >= deadline:
            raise LocalBrokerError(
                f"the broker started for {path} (pid {proc.pid}) did not answer within {timeout:g} s; it is "
                f"left running (it may be recovering a large store). End of {log_path}:\n"
                f"{_log_tail(log_path, log_start)}")
        time.sleep(0.05)
    # It exited. If the store is owned by someone else whose broker announces itself soon (an embedded
    # broker that is starting), use that one.
    tail = _log_tail(log_path, log_start)
    locked = "already open" in tail
    holder_deadline = min(deadline, time.monotonic() + (_LOCKED_GRACE if locked else 0.0))
    while locked:
        found = find_local_broker(path)
        if found is not None:
            return found
        if time.monotonic() >= holder_deadline:
            break
        time.sleep(0.1)
    reason = f" The store is in use: {_describe_holder(path)}." if locked else ""
    raise LocalBrokerError(f"the broker started for {path} exited with code {code}.{reason} End of {log_path}:\n"
                           f"{tail}")


def _serves_store(pid: int, store_path: str) -> bool:
    """Whether `pid`'s command line is `rmq_eventstore serve` of `store_path` (what `ensure_local_broker`
    starts), read from /proc; False where there is no /proc. Lets `stop_local_broker` stop a broker too busy
    to answer its probe in time (a loaded machine) without ever signalling a process that reused the pid."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = [os.fsdecode(a) for a in f.read().split(b"\0")]
    except OSError:
        return False
    ours = any(a == "rmq_eventstore" or os.path.basename(a) == "rmq-eventstore" for a in args)  # -m, or the script
    if not ours or "serve" not in args:
        return False
    for i, a in enumerate(args[:-1]):
        if a == "--store" and os.path.abspath(args[i + 1]) == store_path:
            return True
    return False


def stop_local_broker(store_path: str | os.PathLike[str], timeout: float = 10.0) -> bool:
    """SIGTERM the broker announced for the store (a clean shutdown) and wait up to `timeout` seconds for
    it to exit and its `broker.json` to go. True when a broker was stopped; False when none answered (a
    provably stale file, whose pid is dead, is removed) or it did not exit in time. A broker that does not
    answer its probe is still stopped when its command line shows it serves this store (a busy machine). A
    broker embedded in this very process is refused (close its `RunningBroker`)."""
    path = _store_path(store_path)
    data = read_broker_file(path)
    if data is None:
        return False
    pid = data["pid"]
    if not _pid_alive(pid):
        _remove_stale_file(path)
        return False
    if pid == os.getpid():
        raise LocalBrokerError(f"the broker of {path} runs in this process (pid {pid}); close its RunningBroker")
    if find_local_broker(path) is None and not _serves_store(pid, path):
        # alive, but neither answering as that broker nor a `serve` of this store (a reused pid): signal nobody
        return False
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _pid_alive(pid):
            current = read_broker_file(path)
            if current is not None and current.get("pid") == pid:
                _remove_stale_file(path)  # it died without removing it
            return True
        time.sleep(0.05)
    return False


def resolve_namesrv(url: str, *, start: bool = True, **kw: Any) -> str:
    """The name-server address ("host:port") for a store URL: `rmq://` / `rocketmq://host` as given;
    `file:///path` / `rocketmq:///path` through `ensure_local_broker(path, **kw)` (or, with
    `start=False`, `find_local_broker`, raising `LocalBrokerError` when no broker serves the store)."""
    kind, value = parse_url(url)
    if kind == "namesrv":
        if kw:
            raise TypeError(f"options {sorted(kw)} apply to local stores only, not to {url!r}")
        return value
    if start:
        return ensure_local_broker(value, **kw).namesrv_addr
    found = find_local_broker(value, **kw)
    if found is None:
        raise LocalBrokerError(f"no broker serves {value} (no {BROKER_FILE}, or its broker does not answer); "
                               "start one with ensure_local_broker or `rmq-eventstore serve`")
    return found.namesrv_addr


__all__ = [
    "DEFAULT_IDLE_EXIT", "LocalBroker", "LocalBrokerError", "ensure_local_broker", "find_local_broker",
    "parse_url", "resolve_namesrv", "stop_local_broker",
]
