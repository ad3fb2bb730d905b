"""FakeKVSender / FakeKVReceiver: the no-transfer path of fake-host warm-ups."""

from sglang_ext.disagg import FakeKVReceiver, FakeKVSender, KVPoll
from sglang_ext.protocol import FAKE_BOOTSTRAP_HOST


def test_fake_sender_waits_then_succeeds_without_moving_anything():
    s = FakeKVSender(None, f"{FAKE_BOOTSTRAP_HOST}:8998", 7)
    assert s.poll() == KVPoll.WaitingForInput
    s.send([(0, 1)], {"first_token": 1})  # the address is never touched
    assert s.poll() == KVPoll.Success
    s.abort()
    assert s.poll() == KVPoll.Success and s.failure_reason is None


def test_fake_sender_abort():
    s = FakeKVSender(None, f"{FAKE_BOOTSTRAP_HOST}:8998", 8)
    s.abort()
    assert s.poll() == KVPoll.Failed and "aborted" in s.failure_reason


def test_fake_receiver():
    r = FakeKVReceiver(None, "127.0.0.1:1", 9, aux={"cached_tokens": 3})
    assert r.poll() == KVPoll.Bootstrapping
    r.init([(0, 1)])
    assert r.poll() == KVPoll.Success and r.aux() == {"cached_tokens": 3}
