"""Self-tests of the raw MQTT helper against byte vectors from the specs, so the
raw-socket tests rest on a codec that is itself checked (no broker needed)."""

import mqttraw as r


def test_varint_boundaries():
    vectors = {0: b"\x00", 127: b"\x7f", 128: b"\x80\x01", 16383: b"\xff\x7f",
               16384: b"\x80\x80\x01", 2097151: b"\xff\xff\x7f",
               2097152: b"\x80\x80\x80\x01", 268435455: b"\xff\xff\xff\x7f"}
    for n, enc in vectors.items():
        assert r.varint(n) == enc
        assert r.decode_varint(enc, 0) == (n, len(enc))


def test_connect_v311_bytes():
    # MQTT 3.1.1 CONNECT, client id "abc", clean session, keep alive 60
    assert r.connect("abc", version=4, keepalive=60) == (
        b"\x10\x0f\x00\x04MQTT\x04\x02\x00\x3c\x00\x03abc")


def test_connect_v5_with_properties_and_will():
    pkt = r.connect("c", version=5, keepalive=10, props={r.SESSION_EXPIRY: 30},
                    will={"topic": "w", "payload": b"x", "qos": 1, "retain": True,
                          "props": {r.WILL_DELAY: 5}})
    assert pkt == (b"\x10\x1f\x00\x04MQTT\x05\x2e\x00\x0a"
                   b"\x05\x11\x00\x00\x00\x1e"
                   b"\x00\x01c"
                   b"\x05\x18\x00\x00\x00\x05"
                   b"\x00\x01w\x00\x01x")


def test_publish_roundtrip_v5():
    props = [(r.USER_PROPERTY, ("a", "1")), (r.USER_PROPERTY, ("a", "2")),
             (r.CONTENT_TYPE, "t"), (r.SUBSCRIPTION_ID, 300), (r.SUBSCRIPTION_ID, 2)]
    pkt = r.publish("x/y", b"payload", qos=2, retain=True, dup=True, packet_id=513, props=props)
    assert pkt[0] == 0x3D
    length, pos = r.decode_varint(pkt, 1)
    assert length == len(pkt) - pos
    p = r.decode(pkt[0] >> 4, pkt[0] & 0xF, pkt[pos:], 5)
    assert (p.topic, p.payload, p.qos, p.retain, p.dup, p.packet_id) == (
        b"x/y", b"payload", 2, True, True, 513)
    assert p.props == {r.USER_PROPERTY: [("a", "1"), ("a", "2")], r.CONTENT_TYPE: "t",
                       r.SUBSCRIPTION_ID: [300, 2]}


def test_subscribe_and_acks():
    assert r.subscribe(10, [("a/#", 1, True, True, 2)], version=5) == (
        b"\x82\x09\x00\x0a\x00\x00\x03a/#\x2d")
    assert r.subscribe(1, [("t", 2)], version=4) == b"\x82\x06\x00\x01\x00\x01t\x02"
    assert r.ack(r.PUBREL, 5, 4) == b"\x62\x02\x00\x05"
    assert r.disconnect(5, 0x04) == b"\xe0\x02\x04\x00"
    assert r.disconnect(4) == b"\xe0\x00"
