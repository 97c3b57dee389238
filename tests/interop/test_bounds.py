"""Bounded queues, slow consumers, and the counters that say what was dropped."""

import queue
import socket
import threading
import time

import pytest

import mqttraw as r
from pahoclient import PacketTypes, props


def sys_reaches(broker, client_factory, name, predicate, timeout=10.0):
    """Wait until $SYS/broker/<name> satisfies predicate; returns its last value."""
    c = client_factory(broker, version=5)
    c.subscribe(f"$SYS/broker/{name}", 0)
    deadline = time.monotonic() + timeout
    value = None
    while time.monotonic() < deadline:
        try:
            value = int(float(c.messages.get(timeout=0.5).payload))
        except queue.Empty:
            continue
        if predicate(value):
            return value
    raise AssertionError(f"$SYS/broker/{name} = {value}, never satisfied the condition")


def test_slow_subscriber_does_not_slow_others(broker, client_factory):
    """A subscriber that stops reading: publishers and other subscribers carry on."""
    stuck = socket.create_connection(broker.addr, timeout=10)
    stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stuck.sendall(r.connect("stuck", version=5))
    stuck.recv(64)  # CONNACK
    stuck.sendall(r.subscribe(1, [("flood/#", 0)], 5))
    stuck.recv(64)  # SUBACK; from here on it never reads again
    fast = client_factory(broker, version=5)
    fast.subscribe("flood/#", 0)
    fast.subscribe("flood-end", 1)
    pub = client_factory(broker, version=5)
    # 19 MB towards a client that reads nothing (well past any socket buffers); 600
    # messages stay within the default queue bound, so the reading subscriber
    # loses none even on a loaded machine
    n, payload = 600, b"p" * 32768
    start = time.monotonic()
    for i in range(n):
        pub.publish(f"flood/{i % 7}", payload, 0, wait=False)
    pub.publish("flood-end", b"end", 1)  # waits for PUBACK: the publisher got through
    took = time.monotonic() - start
    got = 0
    while True:
        m = fast.expect_message(timeout=15)
        if m.topic == "flood-end":
            break
        got += 1
    stuck.close()
    assert took < 30, f"publishing took {took:.1f}s with a stuck subscriber"
    assert got == n, f"the reading subscriber got {got} of {n} QoS 0 messages"


def test_queue_full_disconnects_slow_consumer(broker_factory, raw_factory, client_factory):
    # A connected client is bounded by bytes: past half of 1 KiB its publisher
    # is held, and staying there for 0.5 s gets it disconnected as slow.
    b = broker_factory(queue_full="disconnect", max_online_queued_bytes=1024,
                       slow_consumer_timeout_ms=500, max_inflight=2)
    slow = raw_factory(b, 5)
    slow.connect("slowpoke-q1")
    slow.subscribe([("qf/t", 1)])
    pub = client_factory(b, version=5)
    for i in range(20):
        pub.publish("qf/t", str(i).encode(), 1)
    pkts = slow.recv_until_closed()
    assert [p.type for p in pkts if p.type == r.PUBLISH], "nothing delivered before the cut"
    assert [p.reason for p in pkts if p.type == r.DISCONNECT] == [0x97], pkts
    sys_reaches(b, client_factory, "errors/slow_consumer_disconnects", lambda v: v >= 1)


@pytest.mark.zerofan_only
def test_dropped_messages_counted(broker_factory, client_factory):
    b = broker_factory(max_queued_messages=3, queue_full="drop_new")
    sub = client_factory(b, client_id="dropper", version=5, clean=False,
                         connect_props=props(PacketTypes.CONNECT, SessionExpiryInterval=300))
    sub.subscribe("dc/t", 1)
    sub.disconnect()
    pub = client_factory(b, version=5)
    for i in range(8):
        pub.publish("dc/t", str(i).encode(), 1)
    sys_reaches(b, client_factory, "messages/dropped", lambda v: v >= 5)


@pytest.mark.zerofan_only
@pytest.mark.parametrize("counter,bad", [
    ("errors/malformed", bytes([0x80]) + r.subscribe(1, [("t", 1)], 5)[1:]),
    ("errors/protocol", r.connect("again", version=5)),
])
def test_bad_input_counted(broker, raw_factory, client_factory, counter, bad):
    c = raw_factory(broker, 5)
    c.connect("counted")
    c.send(bad)
    c.recv_until_closed()
    sys_reaches(broker, client_factory, counter, lambda v: v >= 1)


def receive_numbered(sub, n):
    """The payload numbers of the next `n` PUBLISHes `sub` receives, in order
    (at most 60 s in all, 5 s between two)."""
    got = []
    deadline = time.monotonic() + 60
    while len(got) < n:
        assert time.monotonic() < deadline, f"{len(got)} of {n} arrived"
        try:
            p = sub.recv(timeout=5)
        except TimeoutError:
            pytest.fail(f"{len(got)} of {n} arrived")
        assert p.type == r.PUBLISH, p
        got.append(int(p.payload))
    return got


def test_burst_to_online_subscriber_all_delivered(broker, raw_factory):
    """5,000 QoS 0 messages of 256 B in one write, one online subscriber: all arrive."""
    n = 5000
    sub = raw_factory(broker, 5)
    sub.connect("burst-sub")
    sub.subscribe([("burst/t", 0)])
    pub = raw_factory(broker, 5)
    pub.connect("burst-pub")
    pub.send(b"".join(r.publish("burst/t", b"%-256d" % i, 0, version=5) for i in range(n)))
    got = receive_numbered(sub, n)
    assert got == list(range(n)), "lost or out of order"


# At QoS 1 behind a full window mosquitto (2.0) queues max_queued_messages
# (1,000) of the replay and drops the rest: 1,010 arrive there.
@pytest.mark.parametrize("qos", [0, pytest.param(1, marks=pytest.mark.zerofan_only)])
def test_ten_thousand_retained_all_delivered(broker, raw_factory, qos):
    """A subscription to sensors/# over 10,000 retained messages gets every one,
    paced by a Receive Maximum of 10 at QoS 1."""
    n = 10_000
    dev = raw_factory(broker, 5)
    dev.connect("sensors-dev")
    dev.send(b"".join(r.publish(f"sensors/{i}", b"%-64d" % i, 1, True, False, i + 1, 5)
                      for i in range(n)))
    acked = 0
    deadline = time.monotonic() + 60
    while acked < n:
        assert time.monotonic() < deadline, f"{acked} of {n} retained stored"
        dev.expect(r.PUBACK, timeout=10)
        acked += 1
    dash = raw_factory(broker, 5)
    dash.connect("dashboard", props={r.RECEIVE_MAXIMUM: 10})
    dash.send(r.subscribe(1, [("sensors/#", qos)], 5))
    seen = set()
    unacked = []
    deadline = time.monotonic() + 60
    while len(seen) < n:
        assert time.monotonic() < deadline, f"{len(seen)} of {n} retained arrived"
        try:
            p = dash.recv(timeout=5)
        except TimeoutError:
            pytest.fail(f"{len(seen)} of {n} retained arrived")
        if p.type == r.SUBACK:
            continue
        assert p.type == r.PUBLISH and p.retain, p
        assert p.qos == qos, p
        seen.add(p.topic)
        if qos == 1:
            unacked.append(p.packet_id)
            assert len(unacked) <= 10, "more than Receive Maximum in flight"
            # Acknowledged only once the window is full, so it really paces.
            if len(unacked) == 10 or len(seen) == n:
                dash.send(b"".join(r.ack(r.PUBACK, pid, 5) for pid in unacked))
                unacked = []
    assert len(seen) == n


@pytest.mark.zerofan_only
def test_publisher_pushed_back_then_nothing_lost(broker_factory, raw_factory, client_factory):
    """A subscriber that stops reading holds its publisher back (not read) instead
    of losing its messages; once it reads again, every one arrives."""
    b = broker_factory(max_online_queued_bytes=256 * 1024, slow_consumer_timeout_ms=60_000)
    # 10 MB: more than the socket buffers on both sides and the queue bound
    # can take, so the broker must stop reading the publisher.
    n = 40_000
    sub = raw_factory(b, 5)
    sub.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    sub.connect("held-sub")
    sub.subscribe([("held/t", 0)])
    pub = raw_factory(b, 5)
    pub.connect("held-pub")
    flood = b"".join(r.publish("held/t", b"%-256d" % i, 0, version=5) for i in range(n))
    sender = threading.Thread(target=pub.send, args=(flood,), daemon=True)
    sender.start()
    # The subscriber reads nothing until the broker has pushed back.
    sys_reaches(b, client_factory, "load/publisher_throttles", lambda v: v >= 1)
    got = receive_numbered(sub, n)
    sender.join(timeout=10)
    assert not sender.is_alive()
    assert got == list(range(n)), "lost or out of order"
    sys_reaches(b, client_factory, "messages/dropped", lambda v: v == 0)
