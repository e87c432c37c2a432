"""`Broker`: what consumers and producers need on top of a `MessageStore`, shaped as RocketMQ's broker.

A plain object (usable in-process, no sockets) that wires together:

* managers that own state: `TopicManager` (topics.json, auto-created, retry and DLQ topics),
  `SubscriptionGroupManager` (subscriptionGroup.json), `ConsumerOffsetManager` (consumerOffset.json,
  persisted every `flush_consumer_offset_interval` and at shutdown), `ClientManager` (consumers and
  producers by group, from heartbeats), `PullRequestHoldService` (long polling, woken by the store's
  message-arriving listener), `ScheduleMessageService` (delay levels);
* timer messages: `TimerMessageStore` (timer log, timer wheel, checkpoint; delivery at any time);
* POP consumption: `PopService` (pop, ack, change of invisible time, the revive thread);
* transactions: `TransactionalMessageService` (half messages, ends exactly once per transaction) and the
  `TransactionalMessageCheckService` thread that asks producers about half messages nobody ended;
* statistics: `BrokerStatsService` (runtime info, and a ring buffer of samples for dashboards' charts);
* request processors, one per family (`processor/`: send, pull, query, consumer-manage, client-manage,
  admin, end-transaction, name server), reached through ONE table from request code to processor.

`process(request, channel)` serves a broker request, `process_namesrv` a name-server one (this broker is
its own single-broker name server). A pull that found nothing and may wait comes back as a `PullHold`,
which the server awaits (`wait_for_arrival`) before calling `process_pull(..., allow_suspend=False)`.
New request families register their processor with `register_processor`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from ..common import Message, codec
from ..common.pop import pop_retry_topic
from ..common.topic import (
    AUTO_CREATE_TOPIC_KEY_TOPIC,
    RETRY_GROUP_TOPIC_PREFIX,
    TopicValidationError,
    is_system_topic,
    validate_topic,
)
from ..common.topic_config import PermName, TopicConfig
from ..remoting import HeaderError, RemotingCommand, RequestCode, ResponseCode
from ..store import MessageStore
from ..store.timer import TimerMessageStore
from .acl import AclError, PlainAccessValidator
from .client_manager import ClientManager
from .config import BrokerConfig
from .consumer_offset_manager import ConsumerOffsetManager
from .long_polling import PullHold, PullRequestHoldService
from .pop_service import PopService
from .processor import Processor
from .processor.admin import AdminBrokerProcessor
from .processor.client_manage import ClientManageProcessor
from .processor.consumer_manage import ConsumerManageProcessor
from .processor.end_transaction import EndTransactionProcessor
from .processor.extension import ExtensionProcessor
from .processor.namesrv import NameServerProcessor
from .processor.pop import AckMessageProcessor, PopMessageProcessor
from .processor.pull import PullMessageProcessor
from .processor.query import QueryMessageProcessor
from .processor.send import SendMessageProcessor
from .schedule import ScheduleMessageService
from .stats import BrokerStatsService
from .stream_version import StreamVersionManager
from .subscription_group_manager import SubscriptionGroupManager
from .topic_manager import TopicManager
from .transaction import TransactionalMessageCheckService, TransactionalMessageService

log = logging.getLogger(__name__)


class Broker:
    """A RocketMQ broker over one `MessageStore` (see the module docstring); thread-safe.

    `start()` registers the long-polling hook and starts the delay-level and housekeeping threads;
    `shutdown()` stops them and persists offsets (the store itself is closed by its owner).
    """

    def __init__(self, store: MessageStore, config: BrokerConfig | None = None, broker_addr: str | None = None,
                 **overrides: Any) -> None:
        cfg = config or BrokerConfig()
        for k, v in overrides.items():
            if not hasattr(cfg, k):
                raise TypeError(f"unknown broker setting {k!r}")
            setattr(cfg, k, v)
        self.config = cfg
        self.store = store
        self.broker_addr = broker_addr or store.config.store_host
        # managers
        self.group_manager = SubscriptionGroupManager(store.subscription_group_manager, cfg)
        self.topic_manager = TopicManager(store.topic_config_manager, self.group_manager, cfg)
        self.offset_manager = ConsumerOffsetManager(store.consumer_offset_manager, store)
        self.client_manager = ClientManager(cfg.channel_expired_timeout)
        self.hold_service = PullRequestHoldService()
        self.schedule_service = ScheduleMessageService(store, cfg.message_delay_level)
        self.stream_versions = StreamVersionManager(store)
        sc = store.config
        self.timer_store: TimerMessageStore | None = None
        if sc.timer_wheel_enable:
            self.timer_store = TimerMessageStore(store, sc.timer_precision_ms, sc.timer_max_delay_sec,
                                                 timer_log_file_size=sc.mapped_file_size_timer_log,
                                                 flush_interval_ms=sc.timer_flush_interval_ms)
            self.timer_store.load()
        self.acl: PlainAccessValidator | None = None
        if cfg.acl_enable:
            path = cfg.acl_file or os.path.join(store.config.store_path_root_dir, "config", "plain_acl.yml")
            self.acl = PlainAccessValidator(path)
        self.pop_service = PopService(self)
        self.transaction_service = TransactionalMessageService(self)
        self.transaction_check_service = TransactionalMessageCheckService(self, self.transaction_service)
        self.stats_service = BrokerStatsService(self, cfg.stats_sample_interval, cfg.stats_history_size)
        # processors: one table from request code to processor
        self._processors: dict[int, Processor] = {}
        self._namesrv_processors: dict[int, Processor] = {}
        self.send_processor = SendMessageProcessor(self)
        self.pull_processor = PullMessageProcessor(self)
        self.namesrv_processor = NameServerProcessor(self)
        pop, extension = PopMessageProcessor(self), ExtensionProcessor(self)
        end = EndTransactionProcessor(self)
        self._quick_processors: dict[int, Any] = {RequestCode.POP_MESSAGE: pop, RequestCode.QUERY_STREAM: extension,
                                                  RequestCode.END_TRANSACTION: end}
        for processor in (self.send_processor, self.pull_processor, QueryMessageProcessor(self),
                          ConsumerManageProcessor(self), ClientManageProcessor(self), AdminBrokerProcessor(self),
                          end, extension, pop, AckMessageProcessor(self)):
            for code in processor.CODES:
                self.register_processor(code, processor)
        for code in self.namesrv_processor.CODES:
            self.register_namesrv_processor(code, self.namesrv_processor)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = False

    # -- processor table -------------------------------------------------------------------------------
    def register_processor(self, code: int, processor: Processor) -> None:
        """Serve request `code` with `processor` (replacing any processor registered for it)."""
        self._processors[code] = processor

    def register_namesrv_processor(self, code: int, processor: Processor) -> None:
        """Serve name-server request `code` with `processor`."""
        self._namesrv_processors[code] = processor

    def processor_for(self, code: int) -> Processor | None:
        return self._processors.get(code)

    def quick_processor_for(self, code: int) -> Any:
        """The processor `process_now` serves `code` with (POP_MESSAGE, QUERY_STREAM, END_TRANSACTION), or None."""
        return self._quick_processors.get(code)

    # -- lifecycle ----------------------------------------------------------------------------------
    def start(self) -> None:
        if self._started:
            return
        self._started = True
        self.store.add_message_arriving_listener(self.hold_service.notify_message_arriving,
                                                 when=(self.hold_service, "_waiters"))  # only with held pulls
        tcm = self.topic_manager.file
        if self.config.auto_create_topic_enable and AUTO_CREATE_TOPIC_KEY_TOPIC not in tcm:
            perm = PermName.PERM_READ | PermName.PERM_WRITE | PermName.PERM_INHERIT
            tcm.put(TopicConfig(AUTO_CREATE_TOPIC_KEY_TOPIC, 8, 8, perm))
        self.schedule_service.start()
        if self.timer_store is not None:
            self.timer_store.start()
        self.pop_service.start()
        self.transaction_service.ensure_system_topics()
        self.store.wait_for_dispatch(60.0)
        self.stream_versions.rebuild_reservations(self.transaction_service,
                                                  self.transaction_check_service.open_halves())
        self.transaction_check_service.start()
        self.stats_service.start()
        self._thread = threading.Thread(target=self._housekeeping, name="BrokerScheduledTasks", daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        """Stop the threads and persist consumer and delay offsets (idempotent)."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.schedule_service.shutdown()
        self.pop_service.shutdown()
        if self.timer_store is not None:
            self.timer_store.shutdown()
        self.transaction_check_service.shutdown()
        self.stats_service.shutdown()
        self.offset_manager.persist()

    def persist_consumer_offsets(self) -> None:
        self.offset_manager.persist()

    def _housekeeping(self) -> None:
        interval = self.config.flush_consumer_offset_interval / 1000.0
        last_flush = last_scan = time.monotonic()
        while not self._stop.wait(0.5):
            now = time.monotonic()
            if now - last_flush >= interval:
                last_flush = now
                self.offset_manager.persist()
            if now - last_scan >= 10:
                last_scan = now
                self.client_manager.scan_not_active_channels()

    # -- dispatch -------------------------------------------------------------------------------------
    def process(self, request: RemotingCommand, channel: Any, wait: bool = True) -> RemotingCommand | PullHold | None:
        """Serve one broker request; errors become SYSTEM_ERROR responses with the reason as remark. With
        ACL on, a request from a connection (not an in-process call) is validated first and a refused one
        answers NO_PERMISSION before any processor sees it. With `wait` False, a POP_MESSAGE, QUERY_STREAM or
        END_TRANSACTION that would wait answers None instead (as `process_now`, after the ACL check)."""
        if self.acl is not None and channel is not None:
            try:
                self.acl.validate(request, getattr(channel, "remote_address", ""))
            except AclError as e:
                log.warning("ACL refused request %d from %s: %s", request.code,
                            getattr(channel, "remote_address", "?"), e)
                return request.response(ResponseCode.NO_PERMISSION, str(e))
            except Exception as e:  # a malformed request the checks did not foresee: refused, never served
                log.exception("ACL check of request %d failed", request.code)
                return request.response(ResponseCode.NO_PERMISSION, f"ACL check failed: {type(e).__name__}")
        if not wait and request.code in self._quick_processors:
            return self.serve_quick(request, channel)
        return self._run(self._processors, request, channel)

    def process_now(self, request: RemotingCommand, channel: Any) -> RemotingCommand | None:
        """Serve a POP_MESSAGE, QUERY_STREAM or END_TRANSACTION without blocking: its response, or None when
        it would wait (a POP that found nothing and may wait for an arrival, a stream read that must wait for
        the dispatcher or may be long, an end that must wait for a lock or the dispatcher), or when ACL is on;
        then serve it with `process`, on a thread that may block."""
        if self.acl is not None and channel is not None:
            return None  # checked and served on the blocking path, as every request under ACL
        return self.serve_quick(request, channel)

    def serve_quick(self, request: RemotingCommand, channel: Any, **kwargs: Any) -> RemotingCommand | None:
        """`process_now` without the ACL check (a request checked already: a held POP looked at again, with
        `final=True` once its poll time is over); `kwargs` go to the processor."""
        processor = self._quick_processors.get(request.code)
        if processor is None:
            return None
        try:
            return processor.process(request, channel, wait=False, **kwargs)
        except (HeaderError, TopicValidationError) as e:
            return request.response(ResponseCode.SYSTEM_ERROR, str(e))
        except Exception as e:
            log.exception("request %d failed", request.code)
            return request.response(ResponseCode.SYSTEM_ERROR, f"{type(e).__name__}: {e}")

    def process_namesrv(self, request: RemotingCommand, channel: Any) -> RemotingCommand | PullHold:
        """Serve one name-server request (this broker is its own, single-broker name server)."""
        return self._run(self._namesrv_processors, request, channel)

    @staticmethod
    def _run(table: dict[int, Processor], request: RemotingCommand, channel: Any) -> RemotingCommand | PullHold:
        processor = table.get(request.code)
        if processor is None:
            return request.response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                                    f" request type {request.code} not supported")
        try:
            return processor.process(request, channel)
        except (HeaderError, TopicValidationError) as e:
            return request.response(ResponseCode.SYSTEM_ERROR, str(e))
        except Exception as e:
            log.exception("request %d failed", request.code)
            return request.response(ResponseCode.SYSTEM_ERROR, f"{type(e).__name__}: {e}")

    # -- in-process use (embedded mode, the server, tests) ---------------------------------------------
    def send_messages(self, msgs: list[Message], **kwargs: Any) -> tuple[int, str | None, dict[str, Any] | None]:
        """Check, route and store messages of one topic and queue (see `SendMessageProcessor.put`)."""
        return self.send_processor.put(msgs, **kwargs)

    def put_message(self, msg: Message) -> tuple[int, str | None, dict[str, Any] | None]:
        """In-process send of one message through the broker's checks (delay levels, retry, DLQ)."""
        if msg.properties_string is None:
            msg.properties_string = codec.build_properties_string(msg, msg.uniq_key)
        return self.send_processor.put([msg])

    def process_pull(self, req: RemotingCommand, channel: Any, allow_suspend: bool = True) -> RemotingCommand | PullHold:
        return self.pull_processor.process(req, channel, allow_suspend)

    def pull_blocking(self, group: str, topic: str, queue_id: int, offset: int, max_nums: int = 32,
                      expression: str = "*", suspend_timeout_ms: int = 0) -> RemotingCommand:
        """In-process pull with long polling (blocks the calling thread up to `suspend_timeout_ms`)."""
        return self.pull_processor.pull_blocking(group, topic, queue_id, offset, max_nums, expression,
                                                 suspend_timeout_ms)

    def wait_for_arrival(self, hold: PullHold, wake: Callable[[], None]) -> tuple:
        """Register `wake` for a held pull; a handle for `hold_service.cancel` (see `PullMessageProcessor`)."""
        return self.pull_processor.wait_for_arrival(hold, wake)

    def send_back(self, group: str, commit_log_offset: int, delay_level: int = 0, origin_msg_id: str | None = None,
                  origin_topic: str | None = None, max_reconsume_times: int | None = None) -> tuple[int, str | None]:
        return self.send_processor.send_back(group, commit_log_offset, delay_level, origin_msg_id, origin_topic,
                                             max_reconsume_times)

    def route_data(self, topic: str) -> dict[str, Any] | None:
        return self.namesrv_processor.route_data(topic)

    def topic_config(self, topic: str) -> TopicConfig | None:
        return self.topic_manager.get(topic)

    def create_topic(self, topic: str, read_queue_nums: int = 4, write_queue_nums: int = 4,
                     perm: int = PermName.PERM_READ | PermName.PERM_WRITE, order: bool = False) -> TopicConfig:
        return self.topic_manager.create(topic, read_queue_nums, write_queue_nums, perm, order)

    def delete_topic(self, topic: str) -> list[str]:
        """Delete `topic` in this broker (`AdminBrokerProcessor.deleteTopic`): the topic and, as RocketMQ's
        `clearRetryTopicWhenDeleteTopic` does, the pop retry topics of the groups with offsets in it; for
        each, its config, queues and offsets (`MessageStore.delete_topic`), its pending POP checkpoints and
        its route (routes are answered from the topic configs). System topics are refused
        (`TopicValidationError`). Returns the topics deleted (none for an unknown topic: RocketMQ answers
        success then too)."""
        validate_topic(topic)
        if is_system_topic(topic):
            raise TopicValidationError(f"The topic[{topic}] is conflict with system topic.")
        # First: no revive puts anything of it back from here on (forget_topic waits for a revive in
        # progress, under the revive lock), so the retry topics listed next are all there will be; a
        # revive between the listing and the deletion used to create a pop retry topic that stayed.
        self.pop_service.forget_topic(topic)
        topics = [topic]
        for group in sorted(self.offset_manager.file.which_group_by_topic(topic)):
            retry = pop_retry_topic(group, topic)
            if self.topic_manager.get(retry) is not None:
                topics.append(retry)
        # also the pop retry topics of groups that never committed an offset on it (`%RETRY%<group>_<topic>`)
        suffix = "_" + topic
        topics += sorted(t for t in self.topic_manager.file.topic_config_table()
                         if t.startswith(RETRY_GROUP_TOPIC_PREFIX) and t.endswith(suffix) and t not in topics)
        deleted = []
        for t in topics:
            if self.store.delete_topic(t):
                deleted.append(t)
            self.pop_service.forget_topic(t)
            self.stream_versions.forget_topic(t)
        return deleted

    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        self.offset_manager.commit(group, topic, queue_id, offset)

    def query_offset(self, group: str, topic: str, queue_id: int) -> int | None:
        return self.offset_manager.query(group, topic, queue_id)

    def consumer_ids(self, group: str) -> list[str]:
        return self.client_manager.consumers.consumer_ids(group)

    def on_channel_closed(self, channel: Any) -> None:
        """Forget every registration made over a closed connection."""
        self.client_manager.on_channel_closed(channel)

    def scan_not_active_channels(self) -> None:
        self.client_manager.scan_not_active_channels()
