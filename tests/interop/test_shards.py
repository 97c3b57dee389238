"""Several shards (`threads = 4`): one broker to its clients.

Each client's session lives on the shard its client id hashes to; publishes
cross between shards. These tests drive the real binary over many
connections, so that clients land on every shard.
"""

import time

import pytest

import mqttraw as r

pytestmark = pytest.mark.zerofan_only

SHARDS = 4


@pytest.fixture
def sharded(broker_factory):
    return broker_factory(threads=SHARDS)


def _raw(raw_factory, broker, client_id, version=5):
    c = raw_factory(broker, version)
    ack = c.connect(client_id)
    assert ack.reason == 0, ack
    return c


def test_fan_out_over_shards_every_message_once_in_publisher_order(sharded, raw_factory):
    """200 subscribers and 20 publishers: every subscriber gets every
    message once, each publisher's in the order it sent them."""
    subscribers = []
    for i in range(200):
        c = _raw(raw_factory, sharded, f"fan-sub-{i}")
        assert c.subscribe([("fan/#", 1)]).reasons == [1]
        subscribers.append(c)
    publishers = [_raw(raw_factory, sharded, f"fan-pub-{p}") for p in range(20)]
    per_publisher = 10
    for n in range(per_publisher):
        for p, c in enumerate(publishers):
            c.send(r.publish(f"fan/{p}", b"%d/%d" % (p, n), qos=1, packet_id=n + 1))
    for c in publishers:
        for _ in range(per_publisher):
            c.expect(r.PUBACK)
    want = 20 * per_publisher
    for i, c in enumerate(subscribers):
        seen = {}
        for _ in range(want):
            pkt = c.expect(r.PUBLISH)
            p, n = (int(x) for x in pkt.payload.split(b"/"))
            seen.setdefault(p, []).append(n)
            c.send(r.ack(r.PUBACK, pkt.packet_id))
        assert seen == {p: list(range(per_publisher)) for p in range(20)}, f"subscriber {i}"
        c.assert_silent(0.05)


def test_a_client_id_connecting_twice_lands_on_one_shard(sharded, raw_factory):
    """Whichever shard accepts the second connection, the first one is
    taken over: DISCONNECT 0x8E, for many client ids."""
    for i in range(16):
        cid = f"twice-{i}"
        old = _raw(raw_factory, sharded, cid)
        new = _raw(raw_factory, sharded, cid)
        packets = old.recv_until_closed()
        assert [p.reason for p in packets if p.type == r.DISCONNECT] == [0x8E], cid
        new.ping()


def test_a_shared_group_over_shards_gets_each_message_once(sharded, raw_factory):
    members = []
    for i in range(12):
        c = _raw(raw_factory, sharded, f"member-{i}")
        c.subscribe([("$share/work/jobs/+", 1)])
        members.append(c)
    pub = _raw(raw_factory, sharded, "job-publisher")
    n = 120
    for i in range(n):
        pub.send(r.publish("jobs/a", b"%d" % i, qos=1, packet_id=i % 60000 + 1))
    for _ in range(n):
        pub.expect(r.PUBACK)
    seen = []
    per_member = [0] * len(members)
    deadline = time.monotonic() + 20
    while len(seen) < n and time.monotonic() < deadline:
        for i, c in enumerate(members):
            try:
                pkt = c.recv(timeout=0.02)
            except TimeoutError:
                continue
            if pkt.type == r.PUBLISH:
                seen.append(int(pkt.payload))
                per_member[i] += 1
                c.send(r.ack(r.PUBACK, pkt.packet_id))
    for c in members:
        c.assert_silent(0.05)
    assert sorted(seen) == list(range(n)), "each message to exactly one member"
    assert sum(1 for k in per_member if k) > 1, f"the group spreads: {per_member}"


def test_retained_messages_are_seen_from_every_shard(sharded, raw_factory):
    pub = _raw(raw_factory, sharded, "retainer")
    for i in range(8):
        pub.send(r.publish(f"ret/{i}", b"v%d" % i, qos=1, retain=True, packet_id=i + 1))
    for _ in range(8):
        pub.expect(r.PUBACK)
    # Many client ids: they land on every shard.
    for i in range(24):
        c = _raw(raw_factory, sharded, f"late-{i}")
        c.subscribe([("ret/#", 0)])
        got = sorted(c.expect(r.PUBLISH).payload for _ in range(8))
        assert got == sorted(b"v%d" % k for k in range(8)), f"late-{i}"


def test_sys_reports_every_shard(sharded, raw_factory):
    """`$SYS` comes from one shard, with the totals of all of them."""
    clients = [_raw(raw_factory, sharded, f"counted-{i}") for i in range(12)]
    watcher = _raw(raw_factory, sharded, "sys-watcher")
    watcher.subscribe([("$SYS/broker/clients/connected", 0)])
    deadline = time.monotonic() + 15
    values = []
    while time.monotonic() < deadline:
        pkt = watcher.expect(r.PUBLISH, timeout=max(0.1, deadline - time.monotonic()))
        values.append(int(pkt.payload))
        if values[-1] == len(clients) + 1:
            break
    assert values and values[-1] == len(clients) + 1, values
    # One publisher of `$SYS`: no other shard's own figure interleaves.
    watcher.assert_silent(0.3)
