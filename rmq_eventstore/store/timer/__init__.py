"""RocketMQ 5's timer message store: the timer log, the timer wheel, the checkpoint and the services that
file timer messages and deliver them when due (`TimerMessageStore`)."""

from .timer_checkpoint import TimerCheckpoint
from .timer_log import TimerLog, TimerUnit
from .timer_message_store import (
    TIMER_TOPIC,
    TimerMessageError,
    TimerMessageStore,
    transform_timer_message,
)
from .timer_wheel import Slot, TimerWheel

__all__ = ["TIMER_TOPIC", "Slot", "TimerCheckpoint", "TimerLog", "TimerMessageError", "TimerMessageStore",
           "TimerUnit", "TimerWheel", "transform_timer_message"]
