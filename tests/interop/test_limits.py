"""Limits, each with its reason code (MQTT 5 and 3.1.1) and its counter:
max_connections (overall and per listener), max_connection_rate,
max_publish_rate, max_publish_bytes_rate, max_topic_length,
max_topic_levels, max_packet_size."""

from __future__ import annotations

import pytest

import mqttraw
from brokerenv import IS_ZEROFAN
from secutil import start_broker

pytestmark = pytest.mark.skipif(not IS_ZEROFAN, reason="zerofan limits")


@pytest.fixture
def start(tmp_path):
    made = []

    def go(toml, listeners=1):
        b = start_broker(tmp_path / f"b{len(made)}", "sys_interval = 1\n" + toml, listeners)
        made.append(b)
        return b

    yield go
    for b in made:
        assert b.stop() == 0, b.stderr()[-2000:]


def connack(port, version=5, cid="c"):
    raw = mqttraw.RawClient("127.0.0.1", port, version=version)
    return raw, raw.connect(cid, expect_reason=None).reason


def connack_once_free(port, cid, tries=50):
    """Connect (and close) until the broker has a free slot; the last code."""
    for _ in range(tries):
        raw, rc = connack(port, cid=cid)
        raw.close()
        if rc == 0:
            break
    return rc


def sys_value(port, name, at_least=1, timeout=10.0):
    """A $SYS figure once it reaches `at_least` (refreshed every second)."""
    import time
    raw = mqttraw.RawClient("127.0.0.1", port, version=5)
    raw.connect("sys-reader")
    raw.subscribe([(f"$SYS/broker/{name}", 0)])
    deadline = time.monotonic() + timeout
    value = None
    while time.monotonic() < deadline:
        value = int(raw.expect(mqttraw.PUBLISH, timeout=deadline - time.monotonic()).payload)
        if value >= at_least:
            break
    raw.close()
    return value


def test_max_connections_overall(start):
    b = start('max_connections = 3\nlisten = ["127.0.0.1:0"]\n')
    port = b.listeners[0][1]
    held = []
    for i in range(3):
        raw, rc = connack(port, cid=f"h{i}")
        assert rc == 0
        held.append(raw)
    raw, rc = connack(port, 5, "over5")
    assert rc == 0x97  # Quota exceeded
    raw.close()
    raw, rc = connack(port, 4, "over4")
    assert rc == 3  # Server unavailable
    raw.close()
    held.pop().close()
    # A slot is free again once a connection is gone.
    assert connack_once_free(port, "again") == 0
    for r in held:
        r.close()
    # Before the $SYS client connects: the broker notices the closes a
    # moment later (a quiet connection is parked and its close arrives
    # through the shared poller).
    assert connack_once_free(port, "free") == 0
    assert sys_value(port, "limits/refused/max_connections", 2) >= 2


def test_max_connections_per_listener(start):
    b = start('listen = ["127.0.0.1:0"]\n[[listener]]\nbind = "127.0.0.1:0"\nmax_connections = 1\n',
              listeners=2)
    limited = b.listeners[1][1]
    free = b.listeners[0][1]
    first, rc = connack(limited, cid="l1")
    assert rc == 0
    raw, rc = connack(limited, cid="l2")
    assert rc == 0x97
    raw.close()
    others = [connack(free, cid=f"f{i}") for i in range(3)]
    assert [rc for _, rc in others] == [0, 0, 0]
    for r, _ in others:
        r.close()
    first.close()


def test_max_connection_rate(start):
    b = start('max_connection_rate = 2\nlisten = ["127.0.0.1:0"]\n')
    port = b.listeners[0][1]
    codes = []
    for i, version in enumerate([5, 5, 5, 4]):
        raw, rc = connack(port, version, f"r{i}")
        codes.append(rc)
        raw.close()
    assert codes == [0, 0, 0x9F, 3]
    assert sys_value_after_wait(port, "limits/refused/connection_rate") >= 2


def sys_value_after_wait(port, name):
    import time
    time.sleep(1.1)  # the connection-rate window is one second of wall clock
    return sys_value(port, name, 2)


@pytest.mark.parametrize("version", [4, 5], ids=["v311", "v5"])
def test_max_publish_rate(start, version):
    b = start('max_publish_rate = 5\nlisten = ["127.0.0.1:0"]\n')
    port = b.listeners[0][1]
    raw, rc = connack(port, version, "fast")
    assert rc == 0
    for i in range(5):
        raw.publish("t", b"x", qos=1, packet_id=i + 1)
    raw.send(mqttraw.publish("t", b"x", 1, False, False, 9, version))
    if version == 5:
        d = raw.expect(mqttraw.DISCONNECT)
        assert d.reason == 0x96  # Message rate too high
    with pytest.raises((mqttraw.ConnectionClosed, ConnectionError, OSError)):
        raw.recv(5)
    raw.close()
    assert sys_value(port, "limits/refused/publish_rate") >= 1


def test_max_publish_bytes_rate(start):
    b = start('max_publish_bytes_rate = 1000\nlisten = ["127.0.0.1:0"]\n')
    port = b.listeners[0][1]
    raw, rc = connack(port, 5, "bytes")
    raw.publish("t", b"x" * 600, qos=1, packet_id=1)
    raw.publish("t", b"x" * 400, qos=1, packet_id=2)
    raw.send(mqttraw.publish("t", b"x" * 100, 1, False, False, 3, 5))
    assert raw.expect(mqttraw.DISCONNECT).reason == 0x96
    raw.close()


@pytest.mark.parametrize("version", [4, 5], ids=["v311", "v5"])
def test_max_topic_length(start, version):
    b = start('max_topic_length = 60\nlisten = ["127.0.0.1:0"]\n')
    port = b.listeners[0][1]
    raw, _ = connack(port, version, "len")
    ok = raw.subscribe([("a" * 60, 0), ("b" * 61, 0)])
    assert ok.reasons == [0, 0x8F if version == 5 else 0x80]
    raw.publish("d" * 60, b"fine", qos=1)
    raw.send(mqttraw.publish("c" * 61, b"", 1, False, False, 5, version))
    if version == 5:
        assert raw.expect(mqttraw.DISCONNECT).reason == 0x90
    with pytest.raises((mqttraw.ConnectionClosed, ConnectionError, OSError)):
        raw.recv(5)
    raw.close()
    assert sys_value(port, "limits/refused/topic_length", 2) >= 2


def test_max_topic_levels(start):
    b = start('max_topic_levels = 3\nlisten = ["127.0.0.1:0"]\n')
    port = b.listeners[0][1]
    raw, _ = connack(port, 5, "levels")
    raw.publish("a/b/c", b"", qos=1)
    raw.send(mqttraw.publish("a/b/c/d", b"", 1, False, False, 5, 5))
    assert raw.expect(mqttraw.DISCONNECT).reason == 0x90
    raw.close()


def test_max_packet_size(start):
    b = start('max_packet_size = 1000\nlisten = ["127.0.0.1:0"]\n')
    port = b.listeners[0][1]
    raw, _ = connack(port, 5, "size")
    raw.publish("t", b"x" * 900, qos=1)
    raw.send(mqttraw.publish("t", b"x" * 1000, 1, False, False, 2, 5))
    assert raw.expect(mqttraw.DISCONNECT).reason == 0x95
    raw.close()
