"""POP consumption's requests (`PopMessageProcessor`, `AckMessageProcessor`, `ChangeInvisibleTimeProcessor`):
POP_MESSAGE, ACK_MESSAGE and CHANGE_MESSAGE_INVISIBLETIME over the broker's `PopService`.

POP answers with RocketMQ's response header (popTime, invisibleTime, reviveQid, restNum, startOffsetInfo,
msgOffsetInfo) and the stored records as the body; clients build each message's receipt handle from
them, as RocketMQ's clients do. A POP that finds nothing waits up to its `pollTime` for an arrival and then
answers POLLING_TIMEOUT; the server first tries it on the event loop without waiting (`wait=False`, no
thread hand-off when messages are there) and hands only a POP that must wait to a worker thread."""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from ...common.native import native
from ...common.pop import BatchAck, ExtraInfo, pop_retry_topic
from ...common.topic import RETRY_GROUP_TOPIC_PREFIX
from ...common.topic_config import PermName
from ...remoting import FLAG_RESPONSE, RemotingCommand, RequestCode, ResponseCode, loads_text
from ...store.config_files import ConsumerOffsetManager as ConsumerOffsetFile
from ..consumer_offset_manager import ConsumerOffsetManager
from ..topic_manager import ABSENT

if TYPE_CHECKING:
    from ..broker import Broker

log = logging.getLogger(__name__)

# the POP lane's native halves (None: without the native core, or RMQ_EVENTSTORE_PURE=1): the request's fields
# read from its frame, and the response frame built from its fields
POP_FRAME = getattr(native, "pop_frame", None)
_pop_response = getattr(native, "pop_response", None)
# THE ACK LANE of `_native` (AckMessageProcessor.lane): a BATCH_ACK body's entries, and a read that is one ACK_MESSAGE
# or BATCH_ACK_MESSAGE frame, parsed in C; None without the native core (RMQ_EVENTSTORE_PURE=1, not built)
ACK_BODY = native.ack_body if native is not None and hasattr(native, "ack_body") else None
ACK_FRAME = native.ack_frame if native is not None and hasattr(native, "ack_frame") else None

_QUEUE_MAX = getattr(native, "queue_max", None)  # THE POP READ's ConsumeQueue.get_max_offset_in_queue in C
# THE ACK ONE of `_native`: `lane` + the buffer's `ack_one` for an ACK_MESSAGE or a one-entry BATCH_ACK settled in the
# buffer, in one call (True; None: nothing changed, the lines below decide); None without the native core
_ACK_ONE = getattr(native, "ack_one", None)


MAX_POP_NUMS = 32 * 32
MAX_POLL_TIME_MS = 60_000
_SUCCESS, _NO_MESSAGE, _POLLING_TIMEOUT = (int(c) for c in (ResponseCode.SUCCESS, ResponseCode.NO_MESSAGE,
                                                             ResponseCode.POLLING_TIMEOUT))


class PopMessageProcessor:
    """POP_MESSAGE."""

    CODES = (RequestCode.POP_MESSAGE,)

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        # a POP that may not wait takes `PopService.pop_now` when it can (False: always `_pop_once`, the reference
        # tests/test_pop_lane.py compares the lane against)
        self.now = True

    def process(self, req: RemotingCommand, channel: Any, wait: bool = True, final: bool = False) -> RemotingCommand | None:
        """The POP's response; with `wait` False, None instead of waiting when nothing is there now and the
        request may wait (`pollTime` > 0): the server then holds it on its event loop (`BrokerServer._pop_hold`)
        and serves it again on each arrival; `final` (its poll time is over) answers POLLING_TIMEOUT instead."""
        b = self.broker
        x = req.ext_fields
        group = x.get("consumerGroup")
        if group is None:
            group = req.get_str("consumerGroup")
        topic = x.get("topic")
        if topic is None:
            topic = req.get_str("topic")
        try:  # what `get_int` reads, without a call per field; anything odd goes through it below
            queue_id = int(x.get("queueId") or -1)
            max_nums = int(x.get("maxMsgNums") or 32)
            invisible = int(x["invisibleTime"])
        except (KeyError, ValueError, TypeError):
            queue_id = req.get_int("queueId", -1)
            max_nums = req.get_int("maxMsgNums", 32)
            invisible = req.get_int("invisibleTime")
        poll = self.poll_ms(req)
        max_nums = max(1, min(max_nums, MAX_POP_NUMS))
        expression = x.get("exp") or "*"
        exp_type = x.get("expType")
        if exp_type and exp_type != "TAG" and exp_type.upper() != "TAG":
            return req.response(ResponseCode.SUBSCRIPTION_PARSE_FAILED, "only TAG expressions are served")
        if invisible <= 0:
            return req.response(ResponseCode.SYSTEM_ERROR, f"invisibleTime must be > 0, not {invisible}")
        sg = b.group_manager.find(group)
        if sg is None:
            return req.response(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, f"subscription group [{group}] does not exist")
        tc = b.topic_manager.get(topic)
        if tc is None:
            return req.response(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!")
        if not PermName.is_readable(tc.perm):
            return req.response(ResponseCode.NO_PERMISSION, f"the topic[{topic}] peeking message is forbidden")
        if queue_id >= tc.read_queue_nums:
            return req.response(ResponseCode.SYSTEM_ERROR, f"queueId[{queue_id}] is illegal, topic:[{topic}]")
        # the flattened pop first (the POP lane's; None: not its case, nothing changed): a POP decoded here is one
        # the lane did not take whole (pipelined behind its ack, a held one looked at again, ACL on)
        got = b.pop_service.pop_now(group, topic, queue_id, max_nums, invisible, expression,
                                    tc.read_queue_nums) if self.now and not (wait and poll) else None
        if got is None:
            if wait and poll:
                r = b.pop_service.pop(group, topic, queue_id, max_nums, invisible, expression, poll,
                                      alive=lambda: not getattr(channel, "closed", False))
            else:
                r = b.pop_service.pop(group, topic, queue_id, max_nums, invisible, expression)
            got = (r.pop_time, r.revive_qid, r.rest_num, r.count, r.body, ";".join(r.start_offset_info),
                   ";".join(r.msg_offset_info))
        pop_time, revive_qid, rest, count, body, starts, infos = got
        if count:
            code, remark = _SUCCESS, None
        elif poll and not wait and not final:
            return None
        else:
            code, remark, body = _POLLING_TIMEOUT if poll else _NO_MESSAGE, "no new message", b""
        return _pop_command(code, req.opaque, req.version, remark, pop_time, invisible, revive_qid, rest, starts,
                            infos, body)

    @staticmethod
    def poll_ms(req: RemotingCommand) -> int:
        """The request's `pollTime` as `process` reads it (ms, 0 to MAX_POLL_TIME_MS)."""
        try:
            poll = int(req.ext_fields.get("pollTime") or 0)
        except (ValueError, TypeError):
            poll = req.get_int("pollTime", 0)
        return max(0, min(poll, MAX_POLL_TIME_MS))

    def serve_frame(self, f: tuple) -> bytes | None:
        """The POP lane (`Connection.data_received`): a POP read straight from its frame (`_native.pop_frame`'s
        fields: opaque, version, consumerGroup, topic, queueId, maxMsgNums, invisibleTime, pollTime, exp,
        expType) served as `process(req, channel, wait=False)` serves it, when it is the common case: every
        check passes, `PopService.pop_now` takes it, and it finds messages (or finds none and may not wait).
        Returns the response frame (the bytes `process`'s response encodes to), or None before anything
        changed, for everything else (a refusal, an unusual case, a POP that must wait): the caller then
        decodes the read and serves it as before. No ACL here: the caller takes the lane only without it."""
        opaque, version, group, topic, queue_id, max_nums, invisible, poll, expression, exp_type = f
        if group is None or topic is None or invisible is None or invisible <= 0:
            return None
        if exp_type is not None and exp_type != "TAG" and exp_type != "" and exp_type.upper() != "TAG":
            return None
        b = self.broker
        if b.group_manager.find(group) is None:
            return None
        tc = b.topic_manager.get(topic)
        queue_id = -1 if queue_id is None else queue_id  # as `int(x.get("queueId") or -1)` reads the texts
        if tc is None or not PermName.is_readable(tc.perm) or queue_id >= tc.read_queue_nums:
            return None
        # max(1, min(max_nums, MAX_POP_NUMS)) and max(0, min(poll, MAX_POLL_TIME_MS)), without builtin calls
        if max_nums is None:
            max_nums = 32
        max_nums = 1 if max_nums < 1 else MAX_POP_NUMS if max_nums > MAX_POP_NUMS else max_nums
        poll = 0 if not poll or poll < 0 else MAX_POLL_TIME_MS if poll > MAX_POLL_TIME_MS else poll
        r = b.pop_service.pop_now(group, topic, queue_id, max_nums, invisible, expression or "*", tc.read_queue_nums)
        if r is None:
            return None
        pop_time, revive_qid, rest, count, body, starts, infos = r
        if count:
            code, remark = _SUCCESS, None
        elif poll:
            return None  # it may wait: served again by the usual path, which hands it to a thread
        else:
            code, remark, body = _NO_MESSAGE, "no new message", b""
        frame = _pop_response(code, opaque, version, remark, pop_time, invisible, revive_qid, rest, starts, infos,
                              body) if _pop_response is not None else None
        if frame is None:
            frame = _pop_command(code, opaque, version, remark, pop_time, invisible, revive_qid, rest, starts, infos,
                                 body).encode()
        return frame


def _pop_command(code: int, opaque: int, version: int, remark: str | None, pop_time: int, invisible: int,
                 revive_qid: int, rest: int, starts: str, infos: str, body: bytes) -> RemotingCommand:
    """A POP's response as `req.response` makes it, its extFields already strings (the same bytes on the wire;
    `_native.pop_response` builds its frame)."""
    return RemotingCommand(code, {"popTime": str(pop_time), "invisibleTime": str(invisible),
                                  "reviveQid": str(revive_qid), "restNum": str(rest),
                                  "startOffsetInfo": starts, "msgOffsetInfo": infos},
                           body, opaque, FLAG_RESPONSE, remark, "JAVA", version)


def give_back_popped(broker: Broker, req: RemotingCommand, resp: RemotingCommand) -> int:
    """Make the messages of a POP response that could not be written (its connection closed while the
    long poll was held) visible again at once, by the path of CHANGE_MESSAGE_INVISIBLETIME 0: nobody got
    them, so nobody should wait out their invisible time. Works from the response's header alone
    (popTime, reviveQid, startOffsetInfo, msgOffsetInfo); how many were given back."""
    if req.code != RequestCode.POP_MESSAGE or resp.code != ResponseCode.SUCCESS:
        return 0
    x = resp.ext_fields or {}
    group, topic = req.get_str("consumerGroup"), req.get_str("topic")
    try:
        pop_time, invisible, revive_qid = int(x["popTime"]), int(x["invisibleTime"]), int(x["reviveQid"])
        starts = {}
        for item in filter(None, str(x.get("startOffsetInfo", "")).split(";")):
            retry, qid, start = item.split(" ")
            starts[(retry != "0", int(qid))] = int(start)
        n = 0
        for item in filter(None, str(x.get("msgOffsetInfo", "")).split(";")):
            flag, qid_text, offsets = item.split(" ")
            retry, qid = flag != "0", int(qid_text)
            t = pop_retry_topic(group, topic) if retry else topic
            for off in map(int, filter(None, offsets.split(","))):
                extra = ExtraInfo(starts.get((retry, qid), off), pop_time, invisible, revive_qid, retry,
                                  broker.config.broker_name, qid, off)
                if broker.pop_service.change_invisible_time(group, t, extra, off, 0) is not None:
                    n += 1
        return n
    except (KeyError, ValueError) as e:  # not a response of ours: left to its invisible time
        log.warning("could not give back an undelivered POP response of %s/%s: %s", group, topic, e)
        return 0


class AckMessageProcessor:
    """ACK_MESSAGE, BATCH_ACK_MESSAGE and CHANGE_MESSAGE_INVISIBLETIME."""

    CODES = (RequestCode.ACK_MESSAGE, RequestCode.BATCH_ACK_MESSAGE, RequestCode.CHANGE_MESSAGE_INVISIBLETIME)

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._ack_ctx: tuple | None = None  # _ACK_ONE's fixed arguments (_ack_one_ctx), for the buffer they name

    def _ack_one_ctx(self) -> tuple:
        """`_native.ack_one`'s context, made once: the topic cache, the consume-queue table and the checkpoint buffer's
        parts (objects its owners keep for good; the journal, set at start, is read from the buffer per call), and
        the ConsumerOffsetFile when the buffer's commit / committed are the stock ones over it (then its table is
        read and written in C as commit_offset / query_offset do), else None."""
        b = self.broker
        buffer = b.pop_service.buffer
        om = b.offset_manager
        file = om.file if (type(om) is ConsumerOffsetManager and type(om.file) is ConsumerOffsetFile
                           and buffer._commit == om.commit and buffer._committed == om.file.query_offset) else None
        ctx = self._ack_ctx = (b.topic_manager._cache, ABSENT, b.store.consume_queue_table, buffer, buffer._lock,
                               buffer._by_key, buffer._queues, buffer._committed_by_me, buffer._commit,
                               buffer._committed, file)
        return ctx

    def process(self, req: RemotingCommand, channel: Any) -> RemotingCommand:
        if req.code == RequestCode.BATCH_ACK_MESSAGE:
            return self._batch_ack(req)
        group = req.get_str("consumerGroup")
        topic = req.get_str("topic")
        offset = req.get_int("offset")
        bad = self._check_target(req, group, topic, offset)
        if bad is not None:
            return bad
        try:
            extra = ExtraInfo.split(req.get_str("extraInfo"))
        except ValueError as e:
            return req.response(ResponseCode.ILLEGAL_OPERATION, str(e))
        service = self.broker.pop_service
        if req.code == RequestCode.ACK_MESSAGE:
            ok = service.ack(group, topic, extra, offset)
            return req.response() if ok else req.response(ResponseCode.SYSTEM_ERROR, "ack not written")
        new = service.change_invisible_time(group, topic, extra, offset, req.get_int("invisibleTime"))
        if new is None:
            return req.response(ResponseCode.SYSTEM_ERROR, "checkpoint not written")
        return req.response(ext_fields={"popTime": new.pop_time, "invisibleTime": new.invisible_time,
                                        "reviveQid": new.revive_qid, "extraInfo": new.build()})

    def lane(self, got: tuple) -> bool:
        """The usual ack without the general path: `got` is what `_native.ack_frame` read (a BATCH_ACK_MESSAGE's
        `(frame, entries)` or an ACK_MESSAGE's `(frame, None, group, topic, queueId, offset, <ExtraInfo's eight
        fields>)`; `(None, entries)` for a decoded BATCH_ACK's body, `_native.ack_body`). True when every ack it
        names was settled in the checkpoint buffer (`PopBufferMergeService.ack_runs`: the same bits, journal
        line and consume-offset move as `PopService.ack` / `batch_ack` there): the request's answer is then
        SUCCESS, as `process` answers it. False, having changed nothing, whenever the reference would do anything
        else (a missing topic or queue, an offset outside its queue, a checkpoint stored or not in the buffer,
        a record to write, an error to answer): the caller then serves the request with `process`. The checks
        are `process`'s, in its order: the retry-topic naming of `_in_queue`, its queue bounds (all of an
        entry's offsets in the queue, else the reference filters them), `_check_target`'s for ACK_MESSAGE."""
        if _ACK_ONE is not None and _ACK_ONE(got, self._ack_ctx or self._ack_one_ctx()):
            return True  # the lines below in one C call (THE ACK ONE); None: not its case, nothing changed
        b = self.broker
        if len(got) == 2:  # BATCH_ACK_MESSAGE: (frame, [(c, t, retry, so, q, rq, pt, it, first bit, bit count)])
            entries = got[1]
            if len(entries) == 1:  # the usual: one pop acked
                run = self._lane_run(entries[0])
                return run is not None and b.pop_service.buffer.ack_one(*run)
            runs = []
            for entry in entries:
                run = self._lane_run(entry)
                if run is None:
                    return False
                runs.append(run)
        else:  # ACK_MESSAGE: _check_target's checks, then the buffer
            _, _, group, topic, queue_id, offset, ck_offset, pop_time, _it, _rq, _retry, _bn, extra_qid, _ = got
            tc = b.topic_manager.get(topic)
            if tc is None or not 0 <= queue_id < tc.read_queue_nums:
                return False
            cq = b.store.find_consume_queue(topic, queue_id, create=False)  # the store's min / max offset of it
            if cq is None or offset < cq.get_min_offset_in_queue():
                return False
            top = _QUEUE_MAX(cq) if _QUEUE_MAX is not None else None  # get_max_offset_in_queue in C (None: its own)
            if offset > (cq.get_max_offset_in_queue() if top is None else top):
                return False
            return b.pop_service.buffer.ack_one((group, topic, extra_qid, ck_offset, pop_time), offset, offset + 1)
        return b.pop_service.buffer.ack_runs(runs)

    def _lane_run(self, entry: tuple) -> tuple[tuple, int, int] | None:
        """A BATCH_ACK entry as the lane settles it: (checkpoint key, first offset, end offset), or None where the
        reference would skip or filter it (`_in_queue`: the retry topic by either name, a missing queue, an
        offset outside the queue)."""
        group, topic, retry, start, queue_id, _rq, pop_time, _it, first, count = entry
        if retry and not topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            topic = pop_retry_topic(group, topic)
        cq = self.broker.store.find_consume_queue(topic, queue_id, create=False)
        if cq is None:
            return None
        lo = cq.get_min_offset_in_queue()
        low = start + first
        if lo < 0 or low < lo:
            return None
        top = _QUEUE_MAX(cq) if _QUEUE_MAX is not None else None  # get_max_offset_in_queue in C (None: its own)
        if low + count - 1 > (cq.get_max_offset_in_queue() if top is None else top):
            return None
        return (group, topic, queue_id, start, pop_time), low, low + count

    def _check_target(self, req: RemotingCommand, group: str, topic: str, offset: int) -> RemotingCommand | None:
        """RocketMQ's checks before an ack or a change of invisible time: the topic exists, the queue id is
        one of its read queues, the offset lies in the queue (an ack may name the queue's end, a change of
        invisible time may not); None when they pass."""
        tc = self.broker.topic_manager.get(topic)
        if tc is None:
            return req.response(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!")
        queue_id = req.get_int("queueId", -1)
        if not 0 <= queue_id < tc.read_queue_nums:
            return req.response(ResponseCode.MESSAGE_ILLEGAL, f"queueId[{queue_id}] is illegal, topic:[{topic}] "
                                f"topicConfig.readQueueNums:[{tc.read_queue_nums}] consumer:[{group}]")
        store = self.broker.store
        lo, hi = store.get_min_offset_in_queue(topic, queue_id), store.get_max_offset_in_queue(topic, queue_id)
        if offset < lo or offset > hi or (offset == hi and req.code == RequestCode.CHANGE_MESSAGE_INVISIBLETIME):
            return req.response(ResponseCode.NO_MESSAGE,
                                f"offset is illegal, key:{topic}@{queue_id}, commit:{offset}, store:{lo}~{hi}")
        return None

    def _batch_ack(self, req: RemotingCommand) -> RemotingCommand:
        """BATCH_ACK_MESSAGE: a JSON body `{"acks": [BatchAck, ...]}` (`BatchAckMessageRequestBody`); no body
        or no acks is NO_MESSAGE, as in RocketMQ. As upstream's batch path (`AckMessageProcessor.appendAck`
        with a BatchAck), an entry whose queue does not exist is skipped, and so is each offset outside its
        queue: one stale or foreign handle does not fail the acks beside it. What is left of an entry is
        settled with one revive record (`PopService.batch_ack`); a record not written is SYSTEM_ERROR."""
        try:
            doc = loads_text(req.body.decode() if req.body else "{}")  # UTF-8, as RocketMQ's JSON bodies
            acks = [BatchAck.from_dict(a) for a in doc.get("acks") or []]
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            return req.response(ResponseCode.ILLEGAL_OPERATION, f"bad BATCH_ACK_MESSAGE body: {e}")
        if not acks:
            return req.response(ResponseCode.NO_MESSAGE, "no ack in the request")
        service = self.broker.pop_service
        for ack in acks:
            entry = self._in_queue(ack)
            if entry is not None and not service.batch_ack(entry):
                return req.response(ResponseCode.SYSTEM_ERROR, "ack not written")
        return req.response()

    def _in_queue(self, ack: BatchAck) -> BatchAck | None:
        """The part of a batch entry that names offsets of an existing queue (None: nothing left). Upstream's
        BatchAck names the popped topic with the retry flag (`ExtraInfoUtil.getRealTopic`); our client names
        the retry topic itself: both are accepted."""
        topic = ack.topic
        if ack.retry and not topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            topic = pop_retry_topic(ack.group, topic)
        cq = self.broker.store.find_consume_queue(topic, ack.queue_id, create=False)
        if cq is None:  # the store's min offset of a queue it does not have is -1
            return None
        lo = cq.get_min_offset_in_queue()
        if lo < 0:
            return None
        hi = cq.get_max_offset_in_queue()
        bits = ack.bits
        if not bits:
            return None
        start = ack.start_offset
        if not (lo <= start + min(bits) and start + max(bits) <= hi):  # else all in the queue: kept as they are
            bits = [b for b in bits if lo <= start + b <= hi]
            if not bits:
                return None
        if topic == ack.topic and bits is ack.bits:
            return ack
        return dataclasses.replace(ack, topic=topic, bits=bits)
