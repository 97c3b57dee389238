"""A parked connection's first packet is handled in arrival order (issue #21,
item 5).

zerofan parks a connection that is quiet right after its CONNACK. When such
a client subscribes and, a moment later, another (active) client publishes
on the topic, the SUBSCRIBE reached the broker first and the subscriber must
get the message, as with mosquitto.
"""

import time

import pytest

import mqttraw as r
from brokerenv import THREADS, shard_of

TRIES = 50
# How much later the PUBLISH leaves than the SUBSCRIBE (the issue measured
# 0.09 ms). Arrival order across connections within a few microseconds is
# up to the kernel and the broker's event batch, for mosquitto too; this
# gap is what a broker that handles its input in arrival order keeps.
GAP_S = 100e-6


def _same_shard(prefix: str, other: str) -> str:
    """A client id starting with `prefix` on the shard of `other`: with
    several shards, a subscription reaches the other shards a moment after
    the SUBSCRIBE (its SUBACK waits for that), far more than GAP_S, so
    the test keeps both clients on one shard, where arrival order is what
    parking must keep."""
    want = shard_of(other, THREADS)
    for k in range(1000):
        cid = f"{prefix}-{k}"
        if shard_of(cid, THREADS) == want:
            return cid
    raise AssertionError("no client id on that shard")


def _pause(seconds: float) -> None:
    """A short, exact pause (time.sleep oversleeps by more than GAP_S)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


# Not run against mosquitto: on 2026-11-24 (a loaded 2-core machine) it
# missed the PUBLISH in 1 to 3 of the 50 tries, even with the gap.
@pytest.mark.zerofan_only
def test_parked_subscriber_sees_a_publish_sent_right_after_its_subscribe(broker, raw_factory):
    pub = raw_factory(broker, 5)
    pub.connect("order-pub")
    missed = []
    for i in range(TRIES):
        sub = raw_factory(broker, 5)
        sub.connect(_same_shard(f"order-sub-{i}", "order-pub"))  # quiet: parked
        pub.ping()  # the publisher is running, not parked
        topic = f"order/{i}"
        sub.send(r.subscribe(1, [(topic, 0)], 5))
        _pause(GAP_S)
        pub.send(r.publish(topic, b"first", version=5))
        # The broker may send matching PUBLISHes before the SUBACK (MQTT
        # 3.8.4; with several shards the SUBACK waits until every shard
        # routes the filter, while the subscription already delivers).
        got = []
        while (p := sub.recv(timeout=5)).type != r.SUBACK:
            assert p.type == r.PUBLISH, p
            got.append(p.payload)
        # A second message once the subscription surely exists: the first
        # PUBLISH the subscriber gets tells whether the first one was missed.
        pub.send(r.publish(topic, b"second", version=5))
        if not got:
            got.append(sub.expect(r.PUBLISH, timeout=5).payload)
        if got[0] != b"first":
            missed.append(i)
        sub.disconnect()
    assert missed == [], f"the PUBLISH was missed in {len(missed)}/{TRIES} tries: {missed}"


@pytest.mark.zerofan_only
def test_the_subscribers_were_parked(broker, raw_factory):
    """The test above exercises parking: each client quiet after its CONNACK
    parks, and its SUBSCRIBE wakes it."""
    for i in range(5):
        c = raw_factory(broker, 5)
        c.connect(f"parks-{i}")
        c.subscribe([(f"x/{i}", 0)])
        c.disconnect()
    watch = raw_factory(broker, 5)
    watch.connect("parks-watch")
    watch.subscribe([("$SYS/broker/clients/parks", 0)])
    # Refreshed every second (sys_interval 1); the first may be older.
    parks = []
    for _ in range(4):
        parks.append(int(watch.expect(r.PUBLISH, timeout=5).payload))
        if parks[-1] >= 5:
            break
    assert parks[-1] >= 5, parks
