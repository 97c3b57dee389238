"""CONNECT / CONNACK behaviour."""

import time

import pytest

import mqttraw as r
from brokerenv import IS_ZEROFAN

# Keep alive 1 s: the broker must close after 1.5 s of silence. zerofan's timer is
# exact; mosquitto 2.0 checks keep alive coarsely and takes up to ~6 s.
KA_LATEST = 3.0 if IS_ZEROFAN else 8.0
from pahoclient import PacketTypes, props


def test_clean_start_and_session_present(broker, client_factory, version):
    """Session present is 0 on a clean start, 1 when a kept session resumes."""
    cp = props(PacketTypes.CONNECT, SessionExpiryInterval=300) if version == 5 else None
    c = client_factory(broker, client_id="sp-client", version=version, clean=False,
                       connect_props=cp)
    assert not c.session_present, "a brand-new session must not be 'present'"
    c.subscribe("sp/t", 1)
    c.disconnect()

    c2 = client_factory(broker, client_id="sp-client", version=version, clean=False,
                        connect_props=cp)
    assert c2.session_present, "the kept session must be reported present"
    c2.disconnect()

    c3 = client_factory(broker, client_id="sp-client", version=version, clean=True,
                        connect_props=cp)
    assert not c3.session_present, "clean start/session must discard the old session"


def test_assigned_client_identifier_v5(broker, raw_factory):
    c = raw_factory(broker, 5)
    ack = c.connect("", clean=True)
    assigned = ack.prop(r.ASSIGNED_CLIENT_ID)
    assert assigned, f"no Assigned Client Identifier in {ack!r}"
    # the assigned id is usable: a second empty-id client gets a different one
    c2 = raw_factory(broker, 5)
    assert c2.connect("").prop(r.ASSIGNED_CLIENT_ID) not in (None, assigned)
    c.ping()


def test_empty_client_id_v311(broker, raw_factory):
    """3.1.1: an empty id is accepted with clean session 1, refused (0x02) with 0."""
    c = raw_factory(broker, 4)
    c.connect("", clean=True)
    c.ping()
    bad = raw_factory(broker, 4)
    ack = bad.connect("", clean=False, expect_reason=None)
    assert ack.reason == 0x02, f"expected identifier rejected, got {ack!r}"
    with pytest.raises(r.ConnectionClosed):
        bad.recv(5)


def test_mqtt31_accepted(broker, raw_factory):
    c = raw_factory(broker, 4)
    c.send(r.connect("old-client", version=3))
    ack = c.expect(r.CONNACK)
    assert ack.reason == 0, ack
    c.ping()


def _silent_v5_client(broker, raw_factory, client_id):
    c = raw_factory(broker, 5)
    start = time.monotonic()
    c.connect(client_id, keepalive=1)
    pkts = c.recv_until_closed(timeout=10)
    elapsed = time.monotonic() - start
    assert elapsed >= 1.45, f"closed after {elapsed:.2f}s, before 1.5x the keep alive"
    assert elapsed < KA_LATEST, f"closed only after {elapsed:.2f}s"
    return [p for p in pkts if p.type == r.DISCONNECT]


def test_keepalive_enforced_v5(broker, raw_factory):
    """A v5 client silent for 1.5x its keep alive is closed (any DISCONNECT says 0x8D)."""
    disc = _silent_v5_client(broker, raw_factory, "silent")
    assert all(p.reason == 0x8D for p in disc), disc


@pytest.mark.zerofan_only  # the spec allows a plain close; zerofan promises 0x8D
def test_keepalive_timeout_sends_0x8d(broker, raw_factory):
    disc = _silent_v5_client(broker, raw_factory, "silent-8d")
    assert [p.reason for p in disc] == [0x8D], f"expected DISCONNECT 0x8D, got {disc}"


def test_keepalive_enforced_v311(broker, raw_factory):
    c = raw_factory(broker, 4)
    start = time.monotonic()
    c.connect("silent3", keepalive=1)
    pkts = c.recv_until_closed(timeout=10)
    elapsed = time.monotonic() - start
    assert 1.45 <= elapsed < KA_LATEST, elapsed
    assert pkts == [], f"3.1.1 has no DISCONNECT from the server: {pkts}"


def test_keepalive_pings_keep_connection(broker, raw_factory, version):
    """A client that pings inside its keep alive stays connected past 1.5x."""
    c = raw_factory(broker, version)
    c.connect("pinger", keepalive=1)
    end = time.monotonic() + 3.0
    while time.monotonic() < end:
        c.ping()  # waits for PINGRESP; raises if the broker closed us
        time.sleep(0.4)  # pacing the pings is the point of this test


def test_server_keep_alive_from_max_keepalive(broker_factory, raw_factory):
    b = broker_factory(max_keepalive=10)
    c = raw_factory(b, 5)
    ack = c.connect("ka", keepalive=60)
    assert ack.prop(r.SERVER_KEEP_ALIVE) == 10, ack
    # within the limit: no Server Keep Alive needed, or the client's own value
    c2 = raw_factory(b, 5)
    ack2 = c2.connect("ka2", keepalive=5)
    assert ack2.prop(r.SERVER_KEEP_ALIVE, 5) == 5, ack2


@pytest.mark.zerofan_only
def test_server_keep_alive_enforced(broker_factory, raw_factory):
    """The server keep alive it announced is the one enforced (1.5x of 1 s)."""
    b = broker_factory(max_keepalive=1)
    c = raw_factory(b, 5)
    start = time.monotonic()
    ack = c.connect("ka-enforced", keepalive=60)
    assert ack.prop(r.SERVER_KEEP_ALIVE) == 1, ack
    pkts = c.recv_until_closed(timeout=10)
    assert 1.45 <= time.monotonic() - start < KA_LATEST
    assert [p.reason for p in pkts if p.type == r.DISCONNECT] == [0x8D], pkts


def _takeover_v5(broker, raw_factory, client_id):
    old = raw_factory(broker, 5)
    old.connect(client_id)
    new = raw_factory(broker, 5)
    new.connect(client_id)
    pkts = old.recv_until_closed(timeout=10)
    new.ping()
    return [p.reason for p in pkts if p.type == r.DISCONNECT]


def test_takeover_v5(broker, raw_factory):
    """A second connection with the same id takes over; the old one is closed."""
    reasons = _takeover_v5(broker, raw_factory, "dup-id")
    assert all(x == 0x8E for x in reasons), reasons


@pytest.mark.zerofan_only  # mosquitto 2.0 closes without a DISCONNECT
def test_takeover_sends_0x8e(broker, raw_factory):
    assert _takeover_v5(broker, raw_factory, "dup-id-8e") == [0x8E]


def test_takeover_v311(broker, raw_factory):
    old = raw_factory(broker, 4)
    old.connect("dup-id3")
    new = raw_factory(broker, 4)
    new.connect("dup-id3")
    assert old.recv_until_closed(timeout=10) == []
    new.ping()


def test_takeover_keeps_session_paho(broker, client_factory, version):
    """The new connection (clean 0) inherits the subscriptions of the old one."""
    cp = props(PacketTypes.CONNECT, SessionExpiryInterval=300) if version == 5 else None
    old = client_factory(broker, client_id="paho-dup", version=version, clean=False,
                         connect_props=cp)
    old.subscribe("takeover/t", 1)
    new = client_factory(broker, client_id="paho-dup", version=version, clean=False,
                         connect_props=cp)
    assert new.session_present
    old.expect_disconnect()  # the reason code is checked with raw sockets above:
    # paho 2.1 only decodes a server DISCONNECT's reason when properties follow it
    pub = client_factory(broker, version=version)
    pub.publish("takeover/t", b"after", 1)
    assert new.expect_message().payload == b"after"


def test_receive_maximum_in_connack(broker_factory, raw_factory):
    b = broker_factory(receive_maximum=7)
    c = raw_factory(b, 5)
    ack = c.connect("rm")
    assert ack.prop(r.RECEIVE_MAXIMUM) == 7, ack


def test_maximum_packet_size_in_connack(broker_factory, raw_factory):
    b = broker_factory(max_packet_size=2048)
    c = raw_factory(b, 5)
    ack = c.connect("mps")
    assert ack.prop(r.MAXIMUM_PACKET_SIZE) == 2048, ack


def test_topic_alias_maximum_in_connack(broker_factory, raw_factory):
    b = broker_factory(topic_alias_maximum=5)
    c = raw_factory(b, 5)
    ack = c.connect("tam")
    assert ack.prop(r.TOPIC_ALIAS_MAXIMUM) == 5, ack


def test_connect_user_properties_accepted(broker, raw_factory):
    c = raw_factory(broker, 5)
    c.connect("up", props=[(r.USER_PROPERTY, ("k", "v1")), (r.USER_PROPERTY, ("k", "v2")),
                           (r.USER_PROPERTY, ("other", "x")),
                           (r.REQUEST_PROBLEM_INFO, 0), (r.REQUEST_RESPONSE_INFO, 0)])
    c.ping()


def test_unsupported_auth_method(broker, raw_factory):
    c = raw_factory(broker, 5)
    ack = c.connect("auth", props={r.AUTH_METHOD: "SCRAM-SHA-256", r.AUTH_DATA: b"n,,n=u,r=x"},
                    expect_reason=None)
    assert ack.reason == 0x8C, f"expected Bad authentication method, got {ack!r}"
    with pytest.raises(r.ConnectionClosed):
        c.recv(5)


def test_client_maximum_packet_size_respected(broker, raw_factory, client_factory):
    """The broker never sends a packet larger than the client's Maximum Packet Size."""
    sub = raw_factory(broker, 5)
    sub.connect("small", props={r.MAXIMUM_PACKET_SIZE: 200})
    sub.subscribe([("mps/#", 1)])
    pub = client_factory(broker, version=5)
    pub.publish("mps/big", b"x" * 500, 1)
    pub.publish("mps/small", b"y" * 20, 1)
    p = sub.expect(r.PUBLISH)
    assert p.topic == b"mps/small", f"oversized message delivered: {p!r}"


def test_request_problem_information_zero(broker, raw_factory):
    """With Request Problem Information 0 the server sends no Reason String or User
    Property except on PUBLISH, CONNACK and DISCONNECT (MQTT-3.1.2-29)."""
    c = raw_factory(broker, 5)
    c.connect("quiet", props={r.REQUEST_PROBLEM_INFO: 0})
    acks = [c.subscribe([("rpi/ok", 1)], packet_id=1),
            c.subscribe([("$share/g/rpi/s", 2)], packet_id=2)]
    c.send(r.unsubscribe(3, ["never/subscribed"]))
    acks.append(c.expect(r.UNSUBACK))
    acks.append(c.publish("rpi/nobody", b"x", 1, packet_id=4))  # maybe 0x10 no subscribers
    acks.append(c.publish("rpi/nobody2", b"x", 2, packet_id=5))
    for a in acks:
        assert r.REASON_STRING not in a.props and r.USER_PROPERTY not in a.props, a
    c.ping()


def test_mqtt31_dup_on_subscribe_unsubscribe_pubrel(broker, raw_factory):
    """MQTT 3.1 (§2.1) lets a client set DUP on a resent SUBSCRIBE, UNSUBSCRIBE
    or PUBREL: each is answered, and the connection stays open."""
    c = raw_factory(broker, version=3)
    ack = c.connect("dup31")
    assert ack.reason == 0, ack
    sub = bytearray(r.subscribe(3, [("dup31/t", 1)], version=3))
    sub[0] |= 0x08
    c.send(bytes(sub))
    assert c.expect(r.SUBACK).packet_id == 3
    c.send(r.publish("dup31/t", b"x", qos=2, packet_id=9, version=3))
    assert c.expect(r.PUBREC, skip=(r.PUBLISH,)).packet_id == 9
    rel = bytearray(r.ack(r.PUBREL, 9, version=3))
    rel[0] |= 0x08
    c.send(bytes(rel))
    assert c.expect(r.PUBCOMP, skip=(r.PUBLISH, r.PUBREC)).packet_id == 9
    unsub = bytearray(r.unsubscribe(4, ["dup31/t"], version=3))
    unsub[0] |= 0x08
    c.send(bytes(unsub))
    assert c.expect(r.UNSUBACK, skip=(r.PUBLISH, r.PUBREL)).packet_id == 4
    c.ping()
