"""Retained messages and wills."""

import time

import pytest

import mqttraw as r
from brokerenv import IS_ZEROFAN
from pahoclient import PacketTypes, props


def test_retained_set_replace_clear(broker, client_factory, version):
    pub = client_factory(broker, version=version)
    pub.publish("ret/a", b"one", 1, retain=True)
    pub.publish("ret/b", b"bee", 1, retain=True)
    s1 = client_factory(broker, version=version)
    s1.subscribe("ret/a", 1)
    m = s1.expect_message()
    assert (m.payload, m.retain) == (b"one", True)

    pub.publish("ret/a", b"two", 1, retain=True)  # replace
    live = s1.expect_message()
    assert live.payload == b"two" and not live.retain, "a live delivery is not 'retained'"
    s2 = client_factory(broker, version=version)
    s2.subscribe("ret/#", 1)
    got = sorted((m.topic, m.payload, m.retain) for m in s2.expect_messages(2))
    assert got == [("ret/a", b"two", True), ("ret/b", b"bee", True)]
    s2.assert_no_message(0.3)

    pub.publish("ret/a", b"", 1, retain=True)  # clear
    s3 = client_factory(broker, version=version)
    s3.subscribe("ret/#", 1)
    m = s3.expect_message()
    assert (m.topic, m.payload) == ("ret/b", b"bee")
    s3.assert_no_message(0.5)


def test_retained_qos_is_min_of_publish_and_subscription(broker, client_factory, version):
    pub = client_factory(broker, version=version)
    pub.publish("retq/t", b"q2", 2, retain=True)
    s = client_factory(broker, version=version)
    s.subscribe("retq/t", 1)
    assert s.expect_message().qos == 1


def _raw_with_will(broker, raw_factory, version, client_id, topic, keepalive=60, will_props=None,
                   connect_props=None):
    c = raw_factory(broker, version)
    c.connect(client_id, keepalive=keepalive, props=connect_props,
              will={"topic": topic, "payload": b"gone:" + client_id.encode(), "qos": 1,
                    "props": will_props})
    return c


def test_will_on_unexpected_close(broker, raw_factory, client_factory, version):
    watcher = client_factory(broker, version=version)
    watcher.subscribe("will/#", 1)
    c = _raw_with_will(broker, raw_factory, version, "w-close", "will/close")
    c.close()  # no DISCONNECT
    m = watcher.expect_message()
    assert (m.topic, m.payload, m.qos) == ("will/close", b"gone:w-close", 1)


def test_will_retained(broker, raw_factory, client_factory, version):
    c = raw_factory(broker, version)
    c.connect("w-ret", will={"topic": "willret/t", "payload": b"dead", "qos": 1, "retain": True})
    c.close()
    watcher = client_factory(broker, version=version)
    watcher.subscribe("willret/#", 1)
    # Live or as the retained copy: with shards, a will published after the
    # subscription took effect everywhere arrives live only (RETAIN 0).
    assert watcher.expect_message().payload == b"dead"
    # Either way it was kept as the retained message.
    late = client_factory(broker, version=version)
    late.subscribe("willret/#", 1)
    m = late.expect_message()
    assert (m.payload, m.retain) == (b"dead", True)


def test_will_on_keepalive_timeout(broker, raw_factory, client_factory, version):
    watcher = client_factory(broker, version=version)
    watcher.subscribe("will/#", 1)
    start = time.monotonic()
    _raw_with_will(broker, raw_factory, version, "w-ka", "will/ka", keepalive=1)
    m = watcher.expect_message()
    assert m.payload == b"gone:w-ka"
    assert time.monotonic() - start >= 1.45, "will sent before 1.5x the keep alive"


def test_no_will_on_normal_disconnect(broker, raw_factory, client_factory, version):
    watcher = client_factory(broker, version=version)
    watcher.subscribe("will/#", 1)
    c = _raw_with_will(broker, raw_factory, version, "w-polite", "will/polite")
    c.disconnect()
    # barrier: a message published after the DISCONNECT arrives, the will doesn't
    client_factory(broker, version=version).publish("will/marker", b"m", 1)
    assert watcher.expect_message().topic == "will/marker"
    watcher.assert_no_message(0.5)


def test_will_on_disconnect_0x04(broker, raw_factory, client_factory):
    watcher = client_factory(broker, version=5)
    watcher.subscribe("will/#", 1)
    c = _raw_with_will(broker, raw_factory, 5, "w-04", "will/04")
    c.disconnect(reason=0x04)
    m = watcher.expect_message()
    assert m.payload == b"gone:w-04"


def test_will_delay_interval(broker, raw_factory, client_factory):
    watcher = client_factory(broker, version=5)
    watcher.subscribe("will/#", 1)
    c = _raw_with_will(broker, raw_factory, 5, "w-delay", "will/delay",
                       will_props={r.WILL_DELAY: 2}, connect_props={r.SESSION_EXPIRY: 60})
    c.close()
    start = time.monotonic()
    watcher.assert_no_message(1.2)  # the delay has not run out yet
    m = watcher.expect_message()
    assert m.payload == b"gone:w-delay"
    assert time.monotonic() - start >= 1.9, "will published before its delay"


def test_will_delay_cancelled_by_reconnect(broker, raw_factory, client_factory):
    watcher = client_factory(broker, version=5)
    watcher.subscribe("will/#", 1)
    c = _raw_with_will(broker, raw_factory, 5, "w-back", "will/back",
                       will_props={r.WILL_DELAY: 2}, connect_props={r.SESSION_EXPIRY: 60})
    c.close()
    back = raw_factory(broker, 5)
    back.connect("w-back", clean=False, props={r.SESSION_EXPIRY: 60})
    watcher.assert_no_message(3.0)  # past the will delay: no will, the client came back


def test_will_delay_capped_by_session_expiry(broker, raw_factory, client_factory):
    """The will is published when the session ends, if that is before the delay."""
    watcher = client_factory(broker, version=5)
    watcher.subscribe("will/#", 1)
    c = _raw_with_will(broker, raw_factory, 5, "w-cap", "will/cap",
                       will_props={r.WILL_DELAY: 3600}, connect_props={r.SESSION_EXPIRY: 1})
    c.close()
    m = watcher.expect_message()
    assert m.payload == b"gone:w-cap"


def test_will_properties(broker, raw_factory, client_factory):
    watcher = client_factory(broker, version=5)
    watcher.subscribe("will/#", 1)
    user = [("who", "w-props"), ("who", "again")]
    c = raw_factory(broker, 5)
    c.connect("w-props", will={"topic": "will/props", "payload": b"{\"dead\":true}", "qos": 1,
                               "props": [(r.PAYLOAD_FORMAT, 1),
                                         (r.CONTENT_TYPE, "application/json"),
                                         (r.RESPONSE_TOPIC, "will/reply"),
                                         (r.CORRELATION_DATA, b"\x01\x02"),
                                         (r.MESSAGE_EXPIRY, 120),
                                         (r.USER_PROPERTY, user[0]),
                                         (r.USER_PROPERTY, user[1])]})
    c.close()
    m = watcher.expect_message()
    p = m.properties
    assert m.payload == b"{\"dead\":true}"
    assert p.PayloadFormatIndicator == 1
    assert p.ContentType == "application/json"
    assert p.ResponseTopic == "will/reply"
    assert p.CorrelationData == b"\x01\x02"
    assert 100 <= p.MessageExpiryInterval <= 120
    assert p.UserProperty == user


def _persistent_kw(version, client_id, expiry=300):
    if version == 5:
        return dict(client_id=client_id, version=5, clean=False,
                    connect_props=props(PacketTypes.CONNECT, SessionExpiryInterval=expiry))
    return dict(client_id=client_id, version=4, clean=False)


def test_offline_queue(broker, client_factory, version):
    """A kept session gets its QoS 1/2 messages published while it was away."""
    sub = client_factory(broker, **_persistent_kw(version, "offline"))
    sub.subscribe("off/#", 2)
    sub.disconnect()
    pub = client_factory(broker, version=version)
    for i in range(5):
        pub.publish("off/q1", f"a{i}".encode(), 1)
        pub.publish("off/q2", f"b{i}".encode(), 2)
    back = client_factory(broker, **_persistent_kw(version, "offline"))
    assert back.session_present
    got = back.expect_messages(10)
    q1 = [m.payload for m in got if m.topic == "off/q1"]
    q2 = [m.payload for m in got if m.topic == "off/q2"]
    assert q1 == [f"a{i}".encode() for i in range(5)], "QoS 1 lost or reordered"
    assert q2 == [f"b{i}".encode() for i in range(5)], "QoS 2 lost or reordered"
    assert all(m.qos == (1 if m.topic == "off/q1" else 2) for m in got)
    back.assert_no_message(0.3)


def test_session_expiry_v5(broker, client_factory):
    sub = client_factory(broker, **_persistent_kw(5, "expiring", expiry=1))
    sub.subscribe("sx/t", 1)
    sub.disconnect()
    pub = client_factory(broker, version=5)
    pub.publish("sx/t", b"lost", 1)
    time.sleep(2.2)  # letting the session expire is the behaviour under test
    back = client_factory(broker, **_persistent_kw(5, "expiring", expiry=1))
    assert not back.session_present, "session outlived its expiry interval"
    back.assert_no_message(0.5)


def test_session_expiry_zero_ends_session_v5(broker, client_factory):
    """v5 with clean start 0 but no Session Expiry: the session ends at disconnect."""
    kw = dict(client_id="noexpiry", version=5, clean=False)
    sub = client_factory(broker, **kw)
    sub.subscribe("sz/t", 1)
    sub.disconnect()
    back = client_factory(broker, **kw)
    assert not back.session_present


def test_session_expiry_set_on_disconnect_v5(broker, raw_factory, client_factory):
    """A DISCONNECT may lengthen a nonzero session expiry; the session is kept."""
    c = raw_factory(broker, 5)
    c.connect("sx-disc", clean=True, props={r.SESSION_EXPIRY: 1})
    c.subscribe([("sxd/t", 1)])
    c.disconnect(props={r.SESSION_EXPIRY: 300})
    time.sleep(1.5)  # past the first expiry
    client_factory(broker, version=5).publish("sxd/t", b"kept", 1)
    back = raw_factory(broker, 5)
    ack = back.connect("sx-disc", clean=False, props={r.SESSION_EXPIRY: 300})
    assert ack.session_present
    assert back.expect(r.PUBLISH).payload == b"kept"


@pytest.mark.parametrize("policy", ["drop_oldest", "drop_new"])
def test_offline_queue_limit(broker_factory, client_factory, policy):
    b = broker_factory(max_queued_messages=3, queue_full=policy)
    sub = client_factory(b, **_persistent_kw(5, "limited"))
    sub.subscribe("lim/t", 1)
    sub.disconnect()
    pub = client_factory(b, version=5)
    for i in range(6):
        pub.publish("lim/t", str(i).encode(), 1)
    if IS_ZEROFAN:
        # With shards a PUBACK does not wait for the subscriber's shard to
        # queue the message: wait until it dropped the three over the limit.
        watch = client_factory(b, version=5)
        watch.subscribe("$SYS/broker/messages/dropped", 0)
        deadline = time.monotonic() + 10
        while watch.expect_message(max(0.1, deadline - time.monotonic())).payload != b"3":
            assert time.monotonic() < deadline, "the three over the limit were never dropped"
    back = client_factory(b, **_persistent_kw(5, "limited"))
    got = [m.payload for m in back.expect_messages(3)]
    back.assert_no_message(0.5)
    assert got == ([b"3", b"4", b"5"] if policy == "drop_oldest" else [b"0", b"1", b"2"])
