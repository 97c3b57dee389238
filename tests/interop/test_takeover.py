"""Session takeover right after a normal DISCONNECT (issue #21, item 1).

A device sends a QoS 0 PUBLISH and DISCONNECT, closes its socket, and at once
reconnects with the same client id. What the old connection sent before it
closed must be handled before the new CONNECT: the message is delivered, the
normal DISCONNECT discards the will (no false "offline" alarm), and a Session
Expiry Interval of 0 on the DISCONNECT ends the session (no session present).
"""

import pytest

import mqttraw as r

TRIES = 20


def _reconnect_at_once(broker, raw_factory, version: int, i: int) -> tuple[bool, list[bytes]]:
    """One try: (session present on the reconnect, payloads seen by the watcher)."""
    watcher = raw_factory(broker, version)
    watcher.connect(f"watch-{version}-{i}")
    watcher.subscribe([("tk/#", 0)])

    client_id = f"dev-{version}"
    will = {"topic": "tk/will", "payload": b"offline", "qos": 0}
    old = raw_factory(broker, version)
    if version == 5:
        old.connect(client_id, clean=False, props={r.SESSION_EXPIRY: 300}, will=will)
        bye = r.disconnect(5, 0, {r.SESSION_EXPIRY: 0})
    else:
        old.connect(client_id, clean=True, will=will)
        bye = r.disconnect(4)
    # One write, then the socket closes and the reconnect follows at once.
    old.send(r.publish("tk/data", b"data-%d" % i, version=version) + bye)
    old.close()
    new = raw_factory(broker, version)
    # A marker published by the new connection: everything the takeover
    # caused reached the watcher before it. Every other try sends it in the
    # CONNECT's own write, before the CONNACK: the broker must hold it until
    # the takeover is over, not let it cut the wait short.
    mark = b"mark-%d" % i
    marker = r.publish("tk/mark", mark, version=version)
    reconnect = r.connect(client_id, version, clean=(version != 5))
    if i % 2:
        new.send(reconnect + marker)
        ack = new.expect(r.CONNACK)
    else:
        new.send(reconnect)
        ack = new.expect(r.CONNACK)
        new.send(marker)
    assert ack.reason == 0, ack
    seen = []
    while True:
        p = watcher.expect(r.PUBLISH, timeout=5)
        if p.payload == mark:
            break
        seen.append(p.payload)
    new.disconnect()
    watcher.disconnect()
    return bool(ack.session_present), seen


@pytest.mark.parametrize("version", [4, 5], ids=["v311", "v5"])
def test_reconnect_after_disconnect_keeps_publish_and_drops_will(broker, raw_factory, version):
    wills = delivered = present = 0
    for i in range(TRIES):
        session_present, seen = _reconnect_at_once(broker, raw_factory, version, i)
        wills += seen.count(b"offline")
        delivered += seen.count(b"data-%d" % i)
        present += session_present
    # 3.1.1: the old connection had a clean session, so none is present either.
    assert (wills, delivered, present) == (0, TRIES, 0), (
        f"{wills}/{TRIES} wills published, {delivered}/{TRIES} publishes delivered, "
        f"session present in {present}/{TRIES} reconnects")
