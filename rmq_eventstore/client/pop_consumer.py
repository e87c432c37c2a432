"""`PopConsumer`: RocketMQ 5's POP consumption from the client's side.

`pop` takes up to `max_nums` messages of a topic for the group and makes them invisible to the group's
other consumers for `invisible_time` ms; `ack` settles one (`ack_batch` several), `change_invisible_time`
extends or shortens its invisibility (0: give it back now). A message nobody acked comes back after its
invisible time with its reconsume count raised, through the group's pop retry topic, and goes to the
group's DLQ past its retry maximum. Each popped message carries its receipt handle in the `POP_CK`
property; the message keeps the topic it was popped for, even when it came from the retry topic.
"""

from __future__ import annotations

import logging
import time
from functools import partial
from time import monotonic as _monotonic

from ..common import MessageExt
from ..common.native import native
from ..common.pop import BatchAck, ExtraInfo, bits_text, pop_retry_topic
from ..common.properties import (
    NAME_VALUE_SEPARATOR,
    PROPERTY_POP_CK,
    PROPERTY_RETRY_TOPIC,
    PROPERTY_SEPARATOR,
)
from ..common.topic import validate_group, validate_topic
from ..remoting import RemotingCommand, RequestCode, ResponseCode, next_opaque
from ..remoting.command import OPAQUES
from .base import ROUTE_TTL_SECONDS, ClientBase, decode_records
from .remoting_client import MQBrokerError, client_lone
from .remoting_client import _take_response as _take_response  # the connection's lone-caller response read

_POP_OK = (ResponseCode.SUCCESS, ResponseCode.NO_MESSAGE, ResponseCode.POLLING_TIMEOUT, ResponseCode.POLLING_FULL)
_POLLING_FULL = ResponseCode.POLLING_FULL
log = logging.getLogger(__name__)
_full_warned = [0.0]  # when POLLING_FULL was last logged (once a minute at most)
POLLING_FULL_PAUSE = 1.0  # seconds (at most the poll time) a pop waits when the broker holds too many long polls
_POP_MESSAGE, _BATCH_ACK_MESSAGE = RequestCode.POP_MESSAGE, RequestCode.BATCH_ACK_MESSAGE


def _parse_starts(info: str) -> dict[tuple[bool, int], int]:
    out: dict[tuple[bool, int], int] = {}
    for item in filter(None, info.split(";")):
        retry, qid, start = item.split(" ")
        out[(retry != "0", int(qid))] = int(start)
    return out


def _set_handle(msg: MessageExt, handle: str) -> None:
    """Set the `POP_CK` property without parsing the message's properties (appended to the string when
    they were not parsed yet: the last occurrence of a name wins)."""
    if msg._properties is not None:
        msg._properties[PROPERTY_POP_CK] = handle
        return
    s = msg.properties_string
    msg.properties_string = f"{s}{'' if not s or s.endswith(PROPERTY_SEPARATOR) else PROPERTY_SEPARATOR}" \
                            f"{PROPERTY_POP_CK}{NAME_VALUE_SEPARATOR}{handle}{PROPERTY_SEPARATOR}"


def _get_handle(msg: MessageExt) -> str | None:
    """The message's `POP_CK`, read from the end of its properties string when they were not parsed yet
    (anything else with a `properties` mapping, e.g. kombu's receipts, is asked for it)."""
    if type(msg) is not MessageExt or msg._properties is not None:
        return msg.properties.get(PROPERTY_POP_CK)
    s = msg.properties_string
    lead = PROPERTY_POP_CK + NAME_VALUE_SEPARATOR
    i = s.rfind(lead)
    if i < 0 or (i and s[i - 1] != PROPERTY_SEPARATOR):
        return msg.properties.get(PROPERTY_POP_CK)
    j = s.find(PROPERTY_SEPARATOR, i)
    return s[i + len(lead):j if j >= 0 else len(s)] or None


_LEAD = PROPERTY_POP_CK + NAME_VALUE_SEPARATOR


def pop_set_handles_py(msgs: list[MessageExt], i: int, cls: type, topic: str, leads: dict[int, str]) -> int:
    """The per-message loop of `PopConsumer.pop` (the reference of `_native.pop_set_handles`): from `msgs[i]`
    on, append `leads[queue_id]` (`POP_CK` name, separator and the handle without its offset) + the queue
    offset to the properties string of each unparsed `cls` message of `topic`; returns the index of the
    first message it does not handle (another topic, a queue without a lead, parsed properties) or len."""
    for i in range(i, len(msgs)):  # noqa: B020  # the loop continues from the argument
        m = msgs[i]
        if type(m) is not cls or m._properties is not None:
            return i
        t, q, off, s = m.topic, m.queue_id, m.queue_offset, m.properties_string
        if type(t) is not str or t != topic or type(q) is not int:
            return i
        lead = leads.get(q)
        if type(lead) is not str or type(off) is not int or type(s) is not str:
            return i
        m.properties_string = (f"{s}{lead}{off}{PROPERTY_SEPARATOR}" if not s or s[-1] == PROPERTY_SEPARATOR
                               else f"{s}{PROPERTY_SEPARATOR}{lead}{off}{PROPERTY_SEPARATOR}")
    return len(msgs)


def pop_ack_scan_py(msgs: list[MessageExt], i: int, cls: type, lead: str,
                    acks: dict[tuple[str, str], tuple]) -> int:
    """The per-message loop of `PopConsumer._ack_requests` (the reference of `_native.pop_ack_scan`): from
    `msgs[i]` on, read each unparsed `cls` message's handle off the end of its properties string (after the
    last `lead`), find its entry in `acks` by (topic, handle without its last field), and append int(last
    field) - entry[0] to entry[1]; returns the index of the first message it does not handle or len."""
    skip = len(lead)
    for i in range(i, len(msgs)):  # noqa: B020
        m = msgs[i]
        if type(m) is not cls or m._properties is not None:
            return i
        s = m.properties_string
        if type(s) is not str:
            return i
        j = s.rfind(lead)
        if j < 0 or (j and s[j - 1] != PROPERTY_SEPARATOR):
            return i
        k = s.find(PROPERTY_SEPARATOR, j)
        handle = s[j + skip:k if k >= 0 else len(s)]
        prefix, sp, last = handle.rpartition(" ")
        if not sp:
            return i
        entry = acks.get((m.topic, prefix))
        if type(entry) is not tuple or len(entry) < 2 or type(entry[1]) is not list or type(entry[0]) is not int:
            return i
        try:
            num = int(last, 10)
        except ValueError:
            return i
        entry[1].append(num - entry[0])
    return len(msgs)


_set_handles = native.pop_set_handles if native is not None else pop_set_handles_py
_ack_scan = native.pop_ack_scan if native is not None else pop_ack_scan_py
# A lone caller's pop and ack_batch in C (THE POP CLIENT block of _native.c): the POP_MESSAGE frame, the messages
# of its SUCCESS response read straight from the connection's buffer with their handles set, the BATCH_ACK frame.
# None without the extension (or under RMQ_EVENTSTORE_PURE=1): the Python path below, which stays the
# definition of the bytes and of the messages (tests/test_pop_client_native.py compares them).
_pop_frame = getattr(native, "pop_request_frame", None) if _take_response is not None else None
_pop_take = getattr(native, "pop_take", None) if _pop_frame is not None else None
_ack_frame = getattr(native, "pop_ack_frame", None) if _pop_frame is not None else None
_ack_take = getattr(native, "pop_ack_take", None) if _pop_frame is not None else None
# ... and with an open connection, the opaque, the frame and invoke_frame of a lone caller in one C call (THE LONE
# CALLER block: client_lone's steps; None: nothing sent, the lines above decide): see pop, ack_batch
_pop_lone = getattr(native, "pop_lone", None) if _pop_frame is not None and client_lone is not None else None
_ack_lone = getattr(native, "ack_lone", None) if _pop_lone is not None else None
_valid_topics: set[str] = set()  # names validate_topic passed (pop checks each once; a bounded cache)
_VALID_TOPICS_MAX = 1024


class PopConsumer:
    """POP / ACK consumer of one group; thread-safe."""

    def __init__(self, namesrv_addr: str, group: str, timeout_ms: int = 3000, access_key: str | None = None,
                 secret_key: str | None = None) -> None:
        validate_group(group)
        self.group = group
        self._base = ClientBase(namesrv_addr, timeout_ms / 1000.0, access_key, secret_key)

    def start(self) -> PopConsumer:
        self._base.start()
        return self

    def shutdown(self) -> None:
        self._base.shutdown()

    def __enter__(self) -> PopConsumer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def pop(self, topic: str, max_nums: int = 32, invisible_time: int = 60_000, poll_time: int = 0,
            tags: str = "*", queue_id: int = -1, ack: list[MessageExt] | None = None) -> list[MessageExt]:
        """Up to `max_nums` messages, invisible to the group for `invisible_time` ms; with `poll_time` > 0
        the broker waits up to that many ms for one (long polling).

        `ack`: messages popped before, settled as `ack_batch` does, in the same write as this pop (the
        broker serves the ack first): one round trip for both, as a Redis client pipelines XACK with the
        next XREADGROUP. If the broker refuses the ack, `MQBrokerError` is raised and what this pop took
        comes back after its invisible time."""
        if topic.__class__ is not str or topic not in _valid_topics:
            validate_topic(topic)
            if len(_valid_topics) >= _VALID_TOPICS_MAX:
                _valid_topics.clear()
            _valid_topics.add(topic)
        base = self._base
        if (ack and _ack_frame is not None and ack.__class__ is list and ack[0].topic == topic
                and base.__class__ is ClientBase and base.remoting._sign is None):
            got = self._pop_piped(topic, max_nums, invisible_time, poll_time, tags, queue_id, ack)
            if got is not None:
                return got
        if not ack and _pop_frame is not None and base.__class__ is ClientBase and base.remoting._sign is None:
            # the lone caller's pop: the POP_MESSAGE frame made in C (byte for byte the general path's) and, when
            # the connection's first read is exactly its SUCCESS response, the messages made of it in C
            # (`_native.pop_take`: what `_popped` makes, handles set); with an open connection opaque, frame and
            # request are one C call (`_pop_lone`; None: nothing sent), else invoke_frame sends the frame. Any
            # other response goes through `_popped` as in the general path. A frame declined (an odd argument
            # type): nothing sent, the general path decides.
            route = base._routes.get(topic)  # route(topic), its cached case inline
            if route is None or _monotonic() - route.fetched >= ROUTE_TTL_SECONDS:
                route = base.route(topic)
            brokers = route.broker_addrs
            if brokers:
                broker_name, addr = next(iter(brokers.items()))  # broker_for's: the first broker, its name the handle's
                remoting = base.remoting
                conn = remoting._conns.get(addr)
                timeout = base.timeout + poll_time / 1000.0
                r = (_pop_lone(conn, OPAQUES, self.group, topic, queue_id, max_nums, invisible_time, poll_time, tags,
                               timeout, _pop_take, broker_name)
                     if _pop_lone is not None and conn is not None and not conn.closed else None)
                if r is None:  # no connection yet, its lock busy, another caller reading: invoke_frame decides
                    opaque = next(OPAQUES) & 0x7FFFFFFF
                    frame = _pop_frame(self.group, topic, queue_id, max_nums, invisible_time, poll_time, tags, opaque)
                    if frame is not None:
                        if conn is None or conn.closed:
                            conn = remoting.connection(addr)
                        r = conn.invoke_frame(frame, opaque, _POP_MESSAGE, timeout,
                                              partial(_pop_take, topic, broker_name))  # type: ignore[arg-type]
                if r is not None:
                    if r.__class__ is list:
                        return r
                    if r.code not in _POP_OK:
                        raise MQBrokerError(r.code, r.remark, addr)
                    return self._popped(r, topic, broker_name, poll_time)
        addr = self._base.broker_for(topic)
        if (queue_id.__class__ is int and max_nums.__class__ is int and invisible_time.__class__ is int
                and poll_time.__class__ is int and tags.__class__ is str):  # the extFields as `request` makes them
            cmd = RemotingCommand(_POP_MESSAGE, {
                "consumerGroup": self.group, "topic": topic, "queueId": str(queue_id), "maxMsgNums": str(max_nums),
                "invisibleTime": str(invisible_time), "pollTime": str(poll_time), "bornTime": "0", "initMode": "1",
                "expType": "TAG", "exp": tags, "order": "false"}, b"", next_opaque())
        else:
            cmd = RemotingCommand.request(RequestCode.POP_MESSAGE, {
                "consumerGroup": self.group, "topic": topic, "queueId": queue_id, "maxMsgNums": max_nums,
                "invisibleTime": invisible_time, "pollTime": poll_time, "bornTime": 0, "initMode": 1,
                "expType": "TAG", "exp": tags, "order": False})
        timeout = self._base.timeout + poll_time / 1000.0
        acks = self._ack_requests(ack) if ack else {}
        for other, ack_cmd in acks.items():
            if other != addr:
                self._base.invoke(other, ack_cmd)
        if addr in acks:
            acked, r = self._base.remoting.invoke_many(addr, [acks[addr], cmd], timeout)
            if r.code not in _POP_OK:
                raise MQBrokerError(r.code, r.remark, addr)
            if acked.code != ResponseCode.SUCCESS:
                raise MQBrokerError(acked.code, acked.remark, addr)
        else:
            r = self._base.invoke(addr, cmd, timeout, ok=_POP_OK)
        names = list(self._base.route(topic).broker_addrs)
        return self._popped(r, topic, names[0] if names else "", poll_time)

    def _pop_piped(self, topic: str, max_nums: int, invisible_time: int, poll_time: int, tags: str, queue_id: int,
                   ack: list[MessageExt]) -> list[MessageExt] | None:
        """`pop(..., ack=...)` when `ack` holds plain handles of `topic` popped from its broker: the BATCH_ACK and
        POP frames made in C (the bytes `_ack_requests` and the POP's encode make, as `ack_batch` and the lone
        pop make them) and sent with one write, the two responses read in order. None, having sent nothing,
        when either frame is declined (another topic's or a retry topic's handle, an odd argument type): the
        general path then does it."""
        base = self._base
        route = base._routes.get(topic)  # route(topic), its cached case inline
        if route is None or _monotonic() - route.fetched >= ROUTE_TTL_SECONDS:
            route = base.route(topic)
        brokers = route.broker_addrs
        if not brokers:
            return None
        broker_name, addr = next(iter(brokers.items()))  # broker_for's, and ack_batch's broker for `topic`
        ack_opaque = next(OPAQUES) & 0x7FFFFFFF
        ack_frame = _ack_frame(ack, MessageExt, topic, self.group, ack_opaque)
        if ack_frame is None:
            return None
        pop_opaque = next(OPAQUES) & 0x7FFFFFFF
        pop_frame = _pop_frame(self.group, topic, queue_id, max_nums, invisible_time, poll_time, tags, pop_opaque)
        if pop_frame is None:
            return None
        remoting = base.remoting
        conn = remoting._conns.get(addr)
        if conn is None or conn.closed:
            conn = remoting.connection(addr)
        acked, r = conn.invoke_frames(ack_frame + pop_frame, [(ack_opaque, _BATCH_ACK_MESSAGE),
                                                              (pop_opaque, _POP_MESSAGE)],
                                      base.timeout + poll_time / 1000.0)
        if r.code not in _POP_OK:
            raise MQBrokerError(r.code, r.remark, addr)
        if acked.code != ResponseCode.SUCCESS:
            raise MQBrokerError(acked.code, acked.remark, addr)
        return self._popped(r, topic, broker_name, poll_time)

    def _popped(self, r: RemotingCommand, topic: str, broker_name: str, poll_time: int = 0) -> list[MessageExt]:
        """The messages of a POP response (SUCCESS, NO_MESSAGE, POLLING_TIMEOUT or POLLING_FULL), each with its
        receipt handle (`POP_CK`, ExtraInfo's text on `broker_name`) and the topic it was popped for. POLLING_FULL
        (the broker holds as many long polls as it may, `pop_polling_size`) waits out the rest of the long poll, at
        most POLLING_FULL_PAUSE, so that a consumer loop does not spin on it, and gives nothing."""
        if r.code != ResponseCode.SUCCESS or not r.body:
            if r.code == _POLLING_FULL and poll_time > 0:
                if _monotonic() - _full_warned[0] > 60:
                    _full_warned[0] = _monotonic()
                    log.warning("the broker holds too many long polls (%s): a pop waits %.1f s instead (logged "
                                "once a minute)", r.remark, min(poll_time / 1000.0, POLLING_FULL_PAUSE))
                time.sleep(min(poll_time / 1000.0, POLLING_FULL_PAUSE))
            return []
        x = r.ext_fields
        pop_time, invisible, revive_qid = int(x["popTime"]), int(x["invisibleTime"]), int(x["reviveQid"])
        starts = _parse_starts(x.get("startOffsetInfo", ""))
        msgs = decode_records(r.body)
        # each message's handle is ExtraInfo(start, popTime, invisibleTime, reviveQid, retry, brokerName,
        # queueId, queueOffset).build(): all but the last field are shared by the messages of one queue, so
        # the text before the offset is made once per queue and the loop per message only appends
        prefixes: dict[tuple[str, int], str] = {}
        leads: dict[int, str] = {}  # queue id -> POP_CK name + separator + handle before the offset (topic's)
        i, n = 0, len(msgs)
        while i < n:
            m = msgs[i]  # the first of its queue (its lead is made here), a retry message, parsed properties
            i += 1
            qkey = (m.topic, m.queue_id)
            retry = m.topic != topic
            prefix = prefixes.get(qkey)
            if prefix is None:
                start = starts.get((retry, m.queue_id))
                if start is None:  # no start offset for the queue: the message is its own checkpoint start
                    _set_handle(m, ExtraInfo(m.queue_offset, pop_time, invisible, revive_qid, retry, broker_name,
                                             m.queue_id, m.queue_offset).build())
                    if retry:
                        m.topic = m.properties.get(PROPERTY_RETRY_TOPIC, topic)
                    if i < n:
                        i = _set_handles(msgs, i, MessageExt, topic, leads)
                    continue
                prefix = prefixes[qkey] = (f"{start} {pop_time} {invisible} {revive_qid} {1 if retry else 0} "
                                           f"{broker_name} {m.queue_id} ")
                if not retry:
                    leads[m.queue_id] = _LEAD + prefix
            _set_handle(m, f"{prefix}{m.queue_offset}")
            if retry:
                m.topic = m.properties.get(PROPERTY_RETRY_TOPIC, topic)
            if i < n:  # the plain messages after it, up to the next one that needs this loop
                i = _set_handles(msgs, i, MessageExt, topic, leads)
        return msgs

    def _target(self, msg: MessageExt) -> tuple[str, ExtraInfo]:
        handle = _get_handle(msg)
        if not handle:
            raise ValueError("the message has no POP_CK receipt handle: it was not popped by a PopConsumer")
        extra = ExtraInfo.split(handle)
        return (pop_retry_topic(self.group, msg.topic) if extra.retry else msg.topic), extra

    def ack(self, msg: MessageExt) -> None:
        """Settle a popped message: it will not come back."""
        topic, extra = self._target(msg)
        self._base.invoke(self._base.broker_for(msg.topic), RemotingCommand.request(RequestCode.ACK_MESSAGE, {
            "consumerGroup": self.group, "topic": topic, "queueId": extra.queue_id, "extraInfo": extra.build(),
            "offset": extra.queue_offset}))

    def ack_batch(self, msgs: list[MessageExt]) -> None:
        """Settle several popped messages with one BATCH_ACK_MESSAGE per broker (one entry per pop)."""
        if _ack_frame is not None and msgs.__class__ is list and msgs:
            # popped messages of one topic, their handles plain (not the retry topic's), unsigned, on a
            # ClientBase: the frame `_ack_requests` + encode make, in one C call (None: the general path)
            base = self._base
            topic = msgs[0].topic
            if base.__class__ is ClientBase and base.remoting._sign is None and topic.__class__ is str:
                if _ack_lone is not None:  # an open connection to the cached route's broker: all of it in one C call
                    route = base._routes.get(topic)
                    if (route is not None and route.broker_addrs
                            and _monotonic() - route.fetched < ROUTE_TTL_SECONDS):
                        addr = next(iter(route.broker_addrs.values()))
                        conn = base.remoting._conns.get(addr)
                        if conn is not None and not conn.closed:
                            r = _ack_lone(conn, OPAQUES, msgs, MessageExt, topic, self.group, base.timeout, _ack_take)
                            if r is not None:  # (None: nothing sent)
                                if r is not True and r.code != ResponseCode.SUCCESS:
                                    raise MQBrokerError(r.code, r.remark, addr)
                                return
                opaque = next(OPAQUES) & 0x7FFFFFFF
                frame = _ack_frame(msgs, MessageExt, topic, self.group, opaque)
                if frame is not None:
                    route = base._routes.get(topic)  # broker_for(topic), its cached case inline
                    if (route is not None and route.broker_addrs
                            and _monotonic() - route.fetched < ROUTE_TTL_SECONDS):
                        addr = next(iter(route.broker_addrs.values()))
                    else:
                        addr = base.broker_for(topic)
                    remoting = base.remoting
                    conn = remoting._conns.get(addr)
                    if conn is None or conn.closed:
                        conn = remoting.connection(addr)
                    # a lone SUCCESS response: True (_native.pop_ack_take), else the response decoded
                    r = conn.invoke_frame(frame, opaque, _BATCH_ACK_MESSAGE, base.timeout, _ack_take)
                    if r is not True and r.code != ResponseCode.SUCCESS:
                        raise MQBrokerError(r.code, r.remark, addr)
                    return
        for addr, cmd in self._ack_requests(msgs).items():
            self._base.invoke(addr, cmd)

    def _ack_requests(self, msgs: list[MessageExt]) -> dict[str, RemotingCommand]:
        """The BATCH_ACK_MESSAGE requests settling `msgs`, by broker address: the body is what
        `{"acks": [BatchAck.to_dict(), ...]}` encodes to (compact JSON), written as text directly."""
        by_broker: dict[str, list[tuple[int, list[int], str]]] = {}
        # the handles of one pop's queue differ only in their last field (the offset): each distinct rest is
        # parsed once (and checked to have the 8 fields then: a later handle with the same rest has them too);
        # the loop over the others (`_ack_scan`) reads a handle off the end of the unparsed properties string
        # and only adds its bit. An entry is (start offset, bits, its JSON text before the bits).
        entries: dict[tuple[str, str], tuple[int, list[int], str]] = {}
        i, n = 0, len(msgs)
        while i < n:
            m = msgs[i]  # the first of its pop's queue (its entry is made here), or one the scan leaves
            i += 1
            handle = _get_handle(m)
            if not handle:
                raise ValueError("the message has no POP_CK receipt handle: it was not popped by a PopConsumer")
            prefix, _, last = handle.rpartition(" ")
            entry = entries.get((m.topic, prefix))
            if entry is None:
                extra = ExtraInfo.split(handle)
                key = (m.topic, extra.build().rpartition(" ")[0])
                entry = entries.get(key)
                if entry is None:
                    topic = pop_retry_topic(self.group, m.topic) if extra.retry else m.topic
                    head = BatchAck.json_head(self.group, topic, extra.retry, extra.ck_queue_offset, extra.queue_id,
                                              extra.revive_qid, extra.pop_time, extra.invisible_time)
                    entry = entries[key] = (extra.ck_queue_offset, [], head)
                    by_broker.setdefault(self._base.broker_for(m.topic), []).append(entry)
                entry[1].append(extra.queue_offset - extra.ck_queue_offset)
            else:
                entry[1].append(int(last) - entry[0])
            if i < n:  # the messages after it whose entry is known
                i = _ack_scan(msgs, i, MessageExt, _LEAD, entries)
        return {addr: RemotingCommand(_BATCH_ACK_MESSAGE, {}, (
            '{"acks":[' + ",".join([f"{head}{bits_text(bits)}]}}" for _, bits, head in acks]) + "]}"
        ).encode(), next_opaque()) for addr, acks in by_broker.items()}

    def change_invisible_time(self, msg: MessageExt, invisible_time: int) -> MessageExt:
        """Make a popped message invisible for `invisible_time` ms from now (0: visible again now); the
        message's receipt handle is replaced by the new one, which later acks must use."""
        topic, extra = self._target(msg)
        r = self._base.invoke(self._base.broker_for(msg.topic), RemotingCommand.request(
            RequestCode.CHANGE_MESSAGE_INVISIBLETIME, {
                "consumerGroup": self.group, "topic": topic, "queueId": extra.queue_id,
                "extraInfo": extra.build(), "offset": extra.queue_offset, "invisibleTime": invisible_time}))
        msg.properties[PROPERTY_POP_CK] = r.ext_fields["extraInfo"]
        return msg
