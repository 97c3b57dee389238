"""Flow control, bad input and shutdown."""

import signal
import struct

import pytest

import mqttraw as r
from brokerenv import IS_ZEROFAN


def _receive_window(sub, n):
    got = [sub.expect(r.PUBLISH) for _ in range(n)]
    return got


@pytest.mark.xfail(not IS_ZEROFAN, strict=True,
                   reason="mosquitto 2.0.11 refills a receive-maximum window by two per ack")
def test_receive_maximum_respected(broker, raw_factory, client_factory):
    """Never more unacknowledged QoS 1/2 deliveries than the client's Receive Maximum."""
    sub = raw_factory(broker, 5)
    sub.connect("rm2", props={r.RECEIVE_MAXIMUM: 2})
    sub.subscribe([("fc/#", 2)])
    pub = client_factory(broker, version=5)
    for i in range(6):
        pub.publish("fc/t", str(i).encode(), 1 + i % 2)
    first = _receive_window(sub, 2)
    sub.assert_silent(0.5)  # window full
    # (QoS 0 is outside the quota, but MQTT-4.9.0-2 lets the server hold it back too)

    def complete(p):
        if p.qos == 1:
            sub.send(r.ack(r.PUBACK, p.packet_id))
        else:
            sub.send(r.ack(r.PUBREC, p.packet_id))
            rel = sub.expect(r.PUBREL)
            assert rel.packet_id == p.packet_id
            sub.send(r.ack(r.PUBCOMP, p.packet_id))

    complete(first[0])  # frees one slot: exactly one more arrives
    nxt = sub.expect(r.PUBLISH)
    sub.assert_silent(0.4)
    window, seen = [first[1], nxt], [first[0], first[1], nxt]
    while len(seen) < 6:
        complete(window.pop(0))
        p = sub.expect(r.PUBLISH)
        window.append(p)
        seen.append(p)
        assert len(window) <= 2
    for p in window:
        complete(p)
    assert [int(p.payload) for p in seen] == list(range(6))
    assert [p.qos for p in seen] == [1, 2, 1, 2, 1, 2]
    sub.assert_silent(0.3)


def test_max_inflight_setting(broker_factory, raw_factory, client_factory, version):
    if version == 5 and not IS_ZEROFAN:
        pytest.skip("mosquitto applies max_inflight_messages to 3.1.1 clients only")
    b = broker_factory(max_inflight=3)
    sub = raw_factory(b, version)
    sub.connect("inflight3", props={r.RECEIVE_MAXIMUM: 100} if version == 5 else None)
    sub.subscribe([("mi/#", 1)])
    pub = client_factory(b, version=version)
    for i in range(5):
        pub.publish("mi/t", str(i).encode(), 1)
    got = _receive_window(sub, 3)
    sub.assert_silent(0.5)
    sub.send(r.ack(r.PUBACK, got[0].packet_id, version))
    assert sub.expect(r.PUBLISH).payload == b"3"


def test_client_exceeding_our_receive_maximum(broker_factory, raw_factory, client_factory):
    """A client with more unacknowledged QoS 2 publishes than our Receive Maximum: 0x93."""
    b = broker_factory(receive_maximum=2)
    c = raw_factory(b, 5)
    ack = c.connect("greedy")
    assert ack.prop(r.RECEIVE_MAXIMUM) == 2
    for pid in (1, 2):  # PUBREC, but we never send PUBREL: both stay in flight
        c.send(r.publish("greedy/t", b"x", qos=2, packet_id=pid))
        assert c.expect(r.PUBREC).packet_id == pid
    c.send(r.publish("greedy/t", b"x", qos=2, packet_id=3))
    pkts = c.recv_until_closed()
    assert [p.reason for p in pkts if p.type == r.DISCONNECT] == [0x93], pkts
    other = client_factory(b, version=5)
    other.subscribe("ok", 1)
    other.publish("ok", b"ok", 1)
    assert other.expect_message().payload == b"ok"


def _bad_subscribe_flags(v):
    return bytes([0x80]) + r.subscribe(1, [("t", 1)], v)[1:]  # flags must be 0b0010


def _bad_property(v):
    body = r.mqtt_str("t") + b"\x02\x7f\x00"  # property 0x7F does not exist
    return r.packet(r.PUBLISH, 0, body)


def _topic_overruns(v):
    body = struct.pack("!H", 200) + b"short"
    return r.packet(r.PUBLISH, 0, body)


def _qos3(v):
    return bytes([0x36]) + r.publish("t", b"x", 1, version=v)[1:]


def _second_connect(v):
    return r.connect("again", version=v)


def _wildcard_in_topic_name(v):
    return r.publish("a/+/b", b"x", 0, version=v)


def _pubrel_bad_flags(v):
    return bytes([0x60]) + r.ack(r.PUBREL, 1, v)[1:]  # PUBREL flags must be 0b0010


BAD_INPUT = {
    # name: (builder, MQTT 5 reason codes the spec allows)
    "subscribe-reserved-flags": (_bad_subscribe_flags, {0x81}),
    "pubrel-reserved-flags": (_pubrel_bad_flags, {0x81}),
    "topic-length-overruns-packet": (_topic_overruns, {0x81}),
    "publish-qos-3": (_qos3, {0x81}),
    "second-connect": (_second_connect, {0x82}),
    "wildcard-in-topic-name": (_wildcard_in_topic_name, {0x90, 0x82, 0x81}),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUT))
def test_bad_input_closes_only_that_connection(broker, raw_factory, client_factory, version,
                                               case):
    build, reasons = BAD_INPUT[case]
    bystander = client_factory(broker, version=version)
    bystander.subscribe("by/t", 1)
    bad = raw_factory(broker, version)
    bad.connect(f"bad-{case}")
    bad.send(build(version))
    pkts = bad.recv_until_closed()
    got = [p.reason for p in pkts if p.type == r.DISCONNECT]
    if version == 5:
        if IS_ZEROFAN:  # zerofan promises the reason code on every such close
            assert len(got) == 1 and got[0] in reasons, pkts
        else:
            assert all(x in reasons for x in got), pkts
    else:
        assert got == [], "3.1.1 has no server DISCONNECT"
    bystander.publish("by/t", b"still here", 1)
    assert bystander.expect_message().payload == b"still here"


def test_bad_property_v5(broker, raw_factory, client_factory):
    bystander = client_factory(broker, version=5)
    bad = raw_factory(broker, 5)
    bad.connect("bad-prop")
    bad.send(_bad_property(5))
    pkts = bad.recv_until_closed()
    got = [p.reason for p in pkts if p.type == r.DISCONNECT]
    assert got == [0x81] if IS_ZEROFAN else all(x == 0x81 for x in got), pkts
    bystander.subscribe("bp/t", 1)


def test_oversized_packet(broker_factory, raw_factory, client_factory, version):
    b = broker_factory(max_packet_size=1024)
    bystander = client_factory(b, version=version)
    bystander.subscribe("big/#", 1)
    c = raw_factory(b, version)
    c.connect("oversize")
    c.publish("big/ok", b"x" * 900, 1)
    c.send(r.publish("big/no", b"x" * 2000, 1, packet_id=2, version=version))
    pkts = c.recv_until_closed()
    got = [p.reason for p in pkts if p.type == r.DISCONNECT]
    assert got == ([0x95] if version == 5 else []), pkts
    assert bystander.expect_message().topic == "big/ok"
    bystander.publish("big/after", b"fine", 1)
    assert bystander.expect_message().topic == "big/after"


def test_first_packet_must_be_connect(broker, raw_factory, client_factory):
    c = raw_factory(broker, 4)
    c.send(r.publish("t", b"x", 0, version=4))
    pkts = c.recv_until_closed()
    assert not any(p.type == r.CONNACK for p in pkts), pkts
    client_factory(broker, version=4).subscribe("t", 1)


def test_sigterm_disconnects_clients_and_exits_0(broker, raw_factory):
    v5 = raw_factory(broker, 5)
    v5.connect("shut5")
    v3 = raw_factory(broker, 4)
    v3.connect("shut3")
    broker.proc.send_signal(signal.SIGTERM)
    pkts5 = v5.recv_until_closed()
    pkts3 = v3.recv_until_closed()
    assert broker.terminate() == 0
    got = [p.reason for p in pkts5 if p.type == r.DISCONNECT]
    if IS_ZEROFAN:
        assert got == [0x8B], pkts5
    else:  # mosquitto 2.0 closes without a DISCONNECT
        assert all(x == 0x8B for x in got), pkts5
    assert pkts3 == []


def test_sigint_exits_0(broker, raw_factory):
    c = raw_factory(broker, 5)
    c.connect("int5")
    broker.proc.send_signal(signal.SIGINT)
    c.recv_until_closed()
    assert broker.terminate() == 0
