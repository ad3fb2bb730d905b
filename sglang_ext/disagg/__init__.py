"""PD disaggregation for the CPU reference engine: KV transfer between prefill and decode workers.

Names mirror SGLang's `disaggregation/` (KVPoll, KVManager, KVSender, KVReceiver,
BootstrapServer, FakeKVSender). The engine's prefill and decode queues are the callers.
"""

from sglang_ext.disagg.bootstrap import BootstrapServer
from sglang_ext.disagg.fake_transfer import FakeKVReceiver, FakeKVSender
from sglang_ext.disagg.manager import KVManager, RoomInUseError
from sglang_ext.disagg.poll import KVPoll
from sglang_ext.disagg.ranges import match_ranges, page_ranges
from sglang_ext.disagg.receiver import KVReceiver
from sglang_ext.disagg.sender import KVSender

__all__ = [
    "BootstrapServer",
    "FakeKVReceiver",
    "FakeKVSender",
    "KVManager",
    "KVPoll",
    "KVReceiver",
    "KVSender",
    "RoomInUseError",
    "match_ranges",
    "page_ranges",
]
