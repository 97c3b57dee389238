"""PUBLISH flows, QoS handling and subscription options."""

import time

import pytest

import mqttraw as r
from brokerenv import IS_ZEROFAN
from pahoclient import PacketTypes, props, sub_opts


@pytest.mark.parametrize("qos", [0, 1, 2])
def test_publish_qos_roundtrip(broker, client_factory, version, qos):
    """paho publishes at each QoS and a QoS 2 subscriber receives it at that QoS."""
    sub = client_factory(broker, version=version)
    assert sub.subscribe("rt/#", 2) == [2]
    pub = client_factory(broker, version=version)
    for i in range(3):
        pub.publish(f"rt/{qos}", f"m{i}".encode(), qos)
    got = sub.expect_messages(3)
    assert [m.payload for m in got] == [b"m0", b"m1", b"m2"], "lost or reordered"
    assert all(m.qos == qos and m.topic == f"rt/{qos}" for m in got)
    sub.assert_no_message(0.3)


def test_qos2_flow_inbound_raw(broker, raw_factory, client_factory, version):
    """Client->broker QoS 2: PUBREC, then PUBCOMP after PUBREL; a DUP resend
    before PUBREL is not delivered twice."""
    sub = client_factory(broker, version=version)
    sub.subscribe("q2/in", 2)
    pub = raw_factory(broker, version)
    pub.connect("q2pub")
    pub.send(r.publish("q2/in", b"once", qos=2, packet_id=7, version=version))
    rec = pub.expect(r.PUBREC)
    assert rec.packet_id == 7 and (rec.reason or 0) < 0x80, rec
    pub.send(r.publish("q2/in", b"once", qos=2, packet_id=7, dup=True, version=version))
    rec2 = pub.expect(r.PUBREC)
    assert rec2.packet_id == 7, rec2
    pub.send(r.ack(r.PUBREL, 7, version))
    comp = pub.expect(r.PUBCOMP)
    assert comp.packet_id == 7 and (comp.reason or 0) == 0, comp
    m = sub.expect_message()
    assert (m.payload, m.qos) == (b"once", 2)
    sub.assert_no_message(0.5)


def test_qos_flows_outbound_raw(broker, raw_factory, client_factory, version):
    """Broker->client: QoS 1 with PUBACK, QoS 2 with PUBREC/PUBREL/PUBCOMP,
    nonzero distinct packet identifiers."""
    sub = raw_factory(broker, version)
    sub.connect("outflows")
    sub.subscribe([("out/#", 2)])
    pub = client_factory(broker, version=version)
    pub.publish("out/1", b"one", 1)
    p1 = sub.expect(r.PUBLISH)
    assert (p1.qos, p1.payload) == (1, b"one") and p1.packet_id, p1
    sub.send(r.ack(r.PUBACK, p1.packet_id, version))
    pub.publish("out/2", b"two", 2)
    p2 = sub.expect(r.PUBLISH)
    assert (p2.qos, p2.payload) == (2, b"two") and p2.packet_id, p2
    sub.send(r.ack(r.PUBREC, p2.packet_id, version))
    rel = sub.expect(r.PUBREL)
    assert rel.packet_id == p2.packet_id and rel.flags == 0x02, rel
    sub.send(r.ack(r.PUBCOMP, p2.packet_id, version))
    pub.publish("out/3", b"three", 1)
    p3 = sub.expect(r.PUBLISH)
    sub.send(r.ack(r.PUBACK, p3.packet_id, version))
    sub.assert_silent(0.3)


def _persistent(version):
    return {"clean": False, "props": {r.SESSION_EXPIRY: 300}} if version == 5 else {"clean": False}


def test_dup_redelivery_on_resume(broker, raw_factory, client_factory, version):
    """Unacknowledged QoS 1 and 2 deliveries are resent with DUP when the session
    resumes; a PUBREC'd QoS 2 message resumes with PUBREL."""
    sub = raw_factory(broker, version)
    sub.connect("dupsub", **_persistent(version))
    sub.subscribe([("dup/#", 2)])
    pub = client_factory(broker, version=version)
    pub.publish("dup/a", b"q1", 1)
    pub.publish("dup/b", b"q2", 2)
    pub.publish("dup/c", b"q2-recd", 2)
    first = {p.payload: p for p in (sub.expect(r.PUBLISH) for _ in range(3))}
    assert set(first) == {b"q1", b"q2", b"q2-recd"}
    assert not any(p.dup for p in first.values())
    # acknowledge only the first half of the third message's flow, then vanish
    sub.send(r.ack(r.PUBREC, first[b"q2-recd"].packet_id, version))
    sub.expect(r.PUBREL)
    sub.close()

    again = raw_factory(broker, version)
    ack = again.connect("dupsub", **_persistent(version))
    assert ack.session_present
    pubs, rels = {}, []
    while len(pubs) < 2 or not rels:
        p = again.recv()
        if p.type == r.PUBLISH:
            pubs[p.payload] = p
        elif p.type == r.PUBREL:
            rels.append(p)
        else:
            raise AssertionError(f"unexpected {p!r}")
    assert set(pubs) == {b"q1", b"q2"}, pubs
    for payload, p in pubs.items():
        assert p.dup, f"resent {payload!r} without DUP"
        assert p.packet_id == first[payload].packet_id, "packet identifier changed"
        assert p.qos == first[payload].qos
    assert [x.packet_id for x in rels] == [first[b"q2-recd"].packet_id]
    again.send(r.ack(r.PUBACK, pubs[b"q1"].packet_id, version))
    again.send(r.ack(r.PUBREC, pubs[b"q2"].packet_id, version))
    again.send(r.ack(r.PUBCOMP, rels[0].packet_id, version))
    rel2 = again.expect(r.PUBREL)
    assert rel2.packet_id == pubs[b"q2"].packet_id
    again.send(r.ack(r.PUBCOMP, rel2.packet_id, version))
    again.assert_silent(0.3)


@pytest.mark.parametrize("sub_qos,pub_qos", [(0, 1), (0, 2), (1, 2), (2, 1)])
def test_qos_downgrade(broker, client_factory, version, sub_qos, pub_qos):
    """Delivered at min(publish QoS, subscription QoS)."""
    sub = client_factory(broker, version=version)
    assert sub.subscribe("dg/t", sub_qos) == [sub_qos]
    pub = client_factory(broker, version=version)
    pub.publish("dg/t", b"x", pub_qos)
    assert sub.expect_message().qos == min(sub_qos, pub_qos)


def _collect(client, duration=0.5):
    out = [client.expect_message()]
    while True:
        try:
            out.append(client.expect_message(duration))
        except AssertionError:
            return out


def test_overlapping_subscriptions(broker, client_factory, version):
    """Overlapping filters: delivered at the highest matching QoS; in v5 with the
    identifiers of all matching subscriptions."""
    if version == 4 and not IS_ZEROFAN:
        pytest.skip("mosquitto 2.0.11 delivers overlapping 3.1.1 subscriptions at one"
                    " subscription's QoS, not the highest (MQTT-3.3.5-1)")
    sub = client_factory(broker, version=version)
    kw = (lambda i: {"sub_id": i}) if version == 5 else (lambda i: {})
    sub.subscribe("ov/+/x", 0, **kw(1))
    sub.subscribe("ov/#", 2, **kw(2))
    sub.subscribe("ov/a/x", 1, **kw(3))
    sub.subscribe("ov/none", 2, **kw(4))  # does not match
    pub = client_factory(broker, version=version)
    pub.publish("ov/a/x", b"p", 2)
    got = _collect(sub)
    assert max(m.qos for m in got) == 2, [(m.qos) for m in got]
    assert len(got) <= 3
    if version == 5:
        ids = [sorted(getattr(m.properties, "SubscriptionIdentifier", [])) for m in got]
        if len(got) == 1:
            assert ids == [[1, 2, 3]], ids
        else:  # one copy per subscription, each with its own identifier
            assert sorted(sum(ids, [])) == [1, 2, 3] and all(len(i) == 1 for i in ids), ids
    if IS_ZEROFAN:  # zerofan promises one copy at the highest QoS
        assert len(got) == 1


def test_no_local(broker, client_factory):
    me = client_factory(broker, version=5)
    me.subscribe("nl/t", options=sub_opts(1, no_local=True))
    me.subscribe("nl/control", 1)  # without NoLocal: own message comes back
    me.publish("nl/t", b"mine", 1)
    me.publish("nl/control", b"mine-control", 1)
    other = client_factory(broker, version=5)
    other.publish("nl/t", b"theirs", 1)
    got = sorted(m.payload for m in me.expect_messages(2))
    assert got == [b"mine-control", b"theirs"], got
    me.assert_no_message(0.3)


def test_retain_as_published(broker, client_factory):
    rap = client_factory(broker, version=5)
    rap.subscribe("rap/t", options=sub_opts(1, rap=True))
    plain = client_factory(broker, version=5)
    plain.subscribe("rap/t", options=sub_opts(1, rap=False))
    pub = client_factory(broker, version=5)
    pub.publish("rap/t", b"r", 1, retain=True)
    pub.publish("rap/t", b"n", 1, retain=False)
    a, b = rap.expect_messages(2), plain.expect_messages(2)
    assert [(m.payload, m.retain) for m in a] == [(b"r", True), (b"n", False)]
    assert [(m.payload, m.retain) for m in b] == [(b"r", False), (b"n", False)]


@pytest.mark.parametrize("rh", [0, 1, 2])
def test_retain_handling(broker, client_factory, rh):
    pub = client_factory(broker, version=5)
    pub.publish("rh/t", b"kept", 1, retain=True)
    sub = client_factory(broker, version=5)
    sub.subscribe("rh/t", options=sub_opts(1, retain_handling=rh))
    if rh in (0, 1):
        m = sub.expect_message()
        assert (m.payload, m.retain) == (b"kept", True)
    # subscribing again to an existing subscription
    sub.subscribe("rh/t", options=sub_opts(1, retain_handling=rh))
    if rh == 0:
        m = sub.expect_message()
        assert (m.payload, m.retain) == (b"kept", True)
    sub.assert_no_message(0.5)


def test_message_expiry_live(broker, client_factory):
    sub = client_factory(broker, version=5)
    sub.subscribe("exp/live", 1)
    pub = client_factory(broker, version=5)
    pub.publish("exp/live", b"e", 1, properties=props(MessageExpiryInterval=60))
    m = sub.expect_message()
    assert 55 <= m.properties.MessageExpiryInterval <= 60


def test_message_expiry_retained(broker, client_factory):
    """A retained message carries its remaining lifetime and is dropped when expired."""
    pub = client_factory(broker, version=5)
    pub.publish("exp/ret/long", b"long", 1, retain=True,
                properties=props(MessageExpiryInterval=4))
    pub.publish("exp/ret/short", b"short", 1, retain=True,
                properties=props(MessageExpiryInterval=1))
    time.sleep(2.2)  # letting time pass is the behaviour under test
    sub = client_factory(broker, version=5)
    sub.subscribe("exp/ret/#", 1)
    m = sub.expect_message()
    assert m.payload == b"long"
    assert 1 <= m.properties.MessageExpiryInterval <= 2, m.properties.MessageExpiryInterval
    sub.assert_no_message(0.5)


def test_message_expiry_offline_queue(broker, client_factory, raw_factory):
    sub = client_factory(broker, client_id="expsub", version=5, clean=False,
                         connect_props=props(PacketTypes.CONNECT, SessionExpiryInterval=300))
    sub.subscribe("exp/q", 1)
    sub.disconnect()
    pub = client_factory(broker, version=5)
    pub.publish("exp/q", b"short", 1, properties=props(MessageExpiryInterval=1))
    pub.publish("exp/q", b"forever", 1)
    time.sleep(2.2)  # letting time pass is the behaviour under test
    again = client_factory(broker, client_id="expsub", version=5, clean=False,
                           connect_props=props(PacketTypes.CONNECT, SessionExpiryInterval=300))
    assert again.session_present
    assert again.expect_message().payload == b"forever"
    again.assert_no_message(0.5)


def test_properties_passed_through(broker, client_factory):
    sub = client_factory(broker, version=5)
    sub.subscribe("pp/t", 2)
    v3 = client_factory(broker, version=4)
    v3.subscribe("pp/t", 2)
    pub = client_factory(broker, version=5)
    user = [("k", "v1"), ("k", "v2"), ("a", "b"), ("k", "v1")]
    pub.publish("pp/t", "héllo".encode(), 1, properties=props(
        PayloadFormatIndicator=1, ContentType="text/plain; charset=utf-8",
        ResponseTopic="pp/reply", CorrelationData=b"\x00\x01corr\xff", UserProperty=user))
    m = sub.expect_message()
    p = m.properties
    assert m.payload == "héllo".encode()
    assert p.PayloadFormatIndicator == 1
    assert p.ContentType == "text/plain; charset=utf-8"
    assert p.ResponseTopic == "pp/reply"
    assert p.CorrelationData == b"\x00\x01corr\xff"
    assert p.UserProperty == user, "user properties must keep order and duplicates"
    assert v3.expect_message().payload == "héllo".encode()


def test_topic_alias_inbound(broker_factory, raw_factory, client_factory):
    b = broker_factory(topic_alias_maximum=4)
    sub = client_factory(b, version=5)
    sub.subscribe("ta/#", 1)
    pub = raw_factory(b, 5)
    ack = pub.connect("tapub")
    assert ack.prop(r.TOPIC_ALIAS_MAXIMUM, 0) >= 2, ack
    pub.publish("ta/one", b"1", 1, packet_id=1, props={r.TOPIC_ALIAS: 1})
    pub.publish("", b"2", 1, packet_id=2, props={r.TOPIC_ALIAS: 1})
    pub.publish("ta/two", b"3", 1, packet_id=3, props={r.TOPIC_ALIAS: 2})
    pub.publish("ta/remapped", b"4", 1, packet_id=4, props={r.TOPIC_ALIAS: 1})
    pub.publish("", b"5", 1, packet_id=5, props={r.TOPIC_ALIAS: 1})
    pub.publish("", b"6", 1, packet_id=6, props={r.TOPIC_ALIAS: 2})
    got = [(m.topic, m.payload) for m in sub.expect_messages(6)]
    assert got == [("ta/one", b"1"), ("ta/one", b"2"), ("ta/two", b"3"),
                   ("ta/remapped", b"4"), ("ta/remapped", b"5"), ("ta/two", b"6")]


@pytest.mark.parametrize("alias,topic", [(0, "ta/x"), (5, "ta/x"), (3, "")],
                         ids=["zero", "above-max", "unknown"])
def test_topic_alias_invalid(broker_factory, raw_factory, client_factory, alias, topic):
    """Alias 0 or above our maximum: 0x94; an empty topic with an unmapped alias: 0x82.
    Only that connection is closed."""
    b = broker_factory(topic_alias_maximum=4)
    bystander = client_factory(b, version=5)
    bystander.subscribe("ta/#", 1)
    pub = raw_factory(b, 5)
    pub.connect("tabad")
    pub.send(r.publish(topic, b"x", 1, packet_id=1, props={r.TOPIC_ALIAS: alias}))
    pkts = pub.recv_until_closed()
    reasons = [p.reason for p in pkts if p.type == r.DISCONNECT]
    if alias == 0:  # forbidden by MQTT-3.3.2-8; the spec names no single reason code
        assert len(reasons) == 1 and reasons[0] in (0x81, 0x82, 0x94), pkts
    else:
        assert reasons == [0x94 if topic else 0x82], pkts
    bystander.publish("ta/ok", b"ok", 1)
    assert bystander.expect_message().payload == b"ok"


def test_topic_alias_outbound_within_client_maximum(broker, raw_factory, client_factory):
    """Aliases the broker uses never exceed the client's maximum, and resolve right;
    a client that allows none gets none."""
    sub = raw_factory(broker, 5)
    sub.connect("taout", props={r.TOPIC_ALIAS_MAXIMUM: 2})
    sub.subscribe([("tao/#", 0)])
    none = raw_factory(broker, 5)
    none.connect("tanone")
    none.subscribe([("tao/#", 0)])
    pub = client_factory(broker, version=5)
    sent = [f"tao/{t}" for t in "aabbcacba"]
    for i, t in enumerate(sent):
        pub.publish(t, str(i).encode(), 1)
    aliases, resolved, used = {}, [], 0
    for _ in sent:
        p = sub.expect(r.PUBLISH)
        alias = p.prop(r.TOPIC_ALIAS)
        if alias is not None:
            used += 1
            assert 1 <= alias <= 2, f"alias {alias} beyond the client's maximum 2"
            if p.topic:
                aliases[alias] = p.topic
            else:
                assert alias in aliases, f"alias {alias} used before it was set"
        else:
            assert p.topic, "empty topic without an alias"
        resolved.append(((p.topic or aliases[alias]).decode(), p.payload))
    assert resolved == [(t, str(i).encode()) for i, t in enumerate(sent)]
    for _ in sent:
        p = none.expect(r.PUBLISH)
        assert r.TOPIC_ALIAS not in p.props and p.topic, p
    if IS_ZEROFAN:  # zerofan uses aliases outbound; mosquitto 2.0 never does
        assert used > 0, "no topic alias used although the client allows 2"
