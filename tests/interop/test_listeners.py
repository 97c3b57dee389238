"""Listeners: TLS (mqtts), mutual TLS, WebSocket (ws / wss), PROXY protocol,
several listeners at once, and the safe anonymous default. Certificates are
made at test time (secutil.make_certs)."""

from __future__ import annotations

import base64
import os
import socket
import ssl
import struct

import pytest

import mqttraw
from brokerenv import IS_ZEROFAN
from secutil import make_certs, sec_client, start_broker, toml_str

pytestmark = pytest.mark.skipif(not IS_ZEROFAN, reason="zerofan listener configuration")


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture
def brokers():
    made = []
    yield made
    for b in made:
        assert b.stop() == 0, b.stderr()[-2000:]


def tls_table(certs, ca=False, require=False, identity=False) -> str:
    s = f"tls = {{ cert = {toml_str(certs.server)}, key = {toml_str(certs.server_key)}"
    if ca:
        s += f", ca = {toml_str(certs.ca)}"
    if require:
        s += ", require_certificate = true"
    if identity:
        s += ", use_identity_as_username = true"
    return s + " }\n"


def four_listeners(tmp, certs, brokers, extra=""):
    toml = (extra + 'sys_interval = 1\nlisten = ["127.0.0.1:0"]\n'
            '[[listener]]\nbind = "127.0.0.1:0"\n' + tls_table(certs) +
            '[[listener]]\nbind = "127.0.0.1:0"\nprotocol = "websockets"\n'
            '[[listener]]\nbind = "127.0.0.1:0"\nprotocol = "websockets"\n' + tls_table(certs))
    b = start_broker(tmp, toml, 4)
    brokers.append(b)
    assert [k for _, _, k in b.listeners] == ["mqtt", "mqtt+tls", "websockets",
                                             "websockets+tls"]
    return b


@pytest.mark.parametrize("version", [4, 5], ids=["v311", "v5"])
def test_tcp_tls_ws_wss_all_at_once(tmp_path, certs, brokers, version):
    b = four_listeners(tmp_path, certs, brokers)
    tls = {"ca": certs.ca}
    subs = [
        sec_client(b.addr(0), version=version),
        sec_client(b.addr(1), version=version, tls=tls),
        sec_client(b.addr(2), version=version, ws=True),
        sec_client(b.addr(3), version=version, ws=True, tls=tls),
    ]
    try:
        for s in subs:
            assert s.subscribe("mix/#", qos=1) == [1]
        for i, s in enumerate(subs):
            s.publish(f"mix/{i}", b"x" * (1000 * i + 1), qos=1)
        for s in subs:
            got = sorted((m.topic, len(m.payload)) for m in s.expect_messages(4))
            assert got == [(f"mix/{i}", 1000 * i + 1) for i in range(4)]
    finally:
        for s in subs:
            s.close()


def test_large_message_over_wss(tmp_path, certs, brokers):
    b = four_listeners(tmp_path, certs, brokers)
    sub = sec_client(b.addr(3), ws=True, tls={"ca": certs.ca})
    pub = sec_client(b.addr(1), tls={"ca": certs.ca})
    try:
        sub.subscribe("big", qos=1)
        payload = os.urandom(300_000)
        pub.publish("big", payload, qos=1)
        assert sub.expect_message().payload == payload
    finally:
        sub.close()
        pub.close()


def test_plaintext_client_on_tls_port_fails_cleanly(tmp_path, certs, brokers):
    b = four_listeners(tmp_path, certs, brokers)
    raw = mqttraw.RawClient(*b.listeners[1][:2], version=5, timeout=5)
    raw.send(mqttraw.connect("plain"))
    # No CONNACK: the TLS handshake fails and the connection is closed.
    with pytest.raises((ConnectionError, AssertionError, OSError, EOFError, mqttraw.ConnectionClosed)):
        raw.expect(mqttraw.CONNACK)
    raw.close()
    # The broker goes on serving both TLS and plain clients.
    good = sec_client(b.addr(1), tls={"ca": certs.ca})
    plain = sec_client(b.addr(0))
    try:
        good.subscribe("$SYS/broker/security/tls_handshake_failures")
        wait_sys(good, lambda v: v >= 1)
    finally:
        good.close()
        plain.close()
    assert b.alive()


def wait_sys(client, pred, timeout=10.0):
    """Read a $SYS figure until `pred(value)` holds (it refreshes every second)."""
    import time
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = int(client.expect_message(timeout=deadline - time.monotonic()).payload)
        if pred(last):
            return last
    raise AssertionError(f"$SYS value {last} never satisfied the condition")


def tls_connect(port, certs, cert=None, key=None):
    ctx = ssl.create_default_context(cafile=str(certs.ca))
    if cert:
        ctx.load_cert_chain(str(cert), str(key))
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    return ctx.wrap_socket(s, server_hostname="localhost")


def connack_over(sock, version=5):
    sock.sendall(mqttraw.connect("m", version=version))
    data = b""
    while len(data) < 4:
        chunk = sock.recv(100)
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data[0], data[3]


def test_mutual_tls_accepted_and_refused(tmp_path, certs, brokers):
    toml = ('[[listener]]\nbind = "127.0.0.1:0"\nallow_anonymous = true\n'
            + tls_table(certs, ca=True, require=True))
    b = start_broker(tmp_path, toml, 1)
    brokers.append(b)
    port = b.listeners[0][1]
    # A certificate from our CA: accepted (paho and a raw socket).
    c = sec_client(b.addr(0), tls={"ca": certs.ca, "cert": certs.alice, "key": certs.alice_key})
    c.close()
    s = tls_connect(port, certs, certs.alice, certs.alice_key)
    assert connack_over(s) == (0x20, 0)
    s.close()
    # No certificate, or one from another CA: refused by the handshake.
    for cert, key in [(None, None), (certs.rogue, certs.rogue_key)]:
        with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
            s = tls_connect(port, certs, cert, key)
            connack_over(s)
    assert b.alive()
    ok = tls_connect(port, certs, certs.bob, certs.bob_key)
    assert connack_over(ok, version=4) == (0x20, 0)
    ok.close()


def test_use_identity_as_username(tmp_path, certs, brokers):
    acl = tmp_path / "acl"
    acl.write_text("user alice\ntopic readwrite alice/#\nuser bob\ntopic read alice/#\n")
    toml = (f"acl_file = {toml_str(acl)}\n"
            '[[listener]]\nbind = "127.0.0.1:0"\nallow_anonymous = false\n'
            + tls_table(certs, ca=True, require=True, identity=True))
    b = start_broker(tmp_path / "b", toml, 1)
    brokers.append(b)
    alice = sec_client(b.addr(0), tls={"ca": certs.ca, "cert": certs.alice,
                                       "key": certs.alice_key})
    bob = sec_client(b.addr(0), tls={"ca": certs.ca, "cert": certs.bob, "key": certs.bob_key})
    try:
        assert bob.subscribe("alice/#", qos=1) == [1]
        alice.publish("alice/t", b"from alice", qos=1)
        assert bob.expect_message().payload == b"from alice"
        info = bob.c.publish("alice/t", b"from bob", 1)
        info.wait_for_publish(5)
        bob.assert_no_message(0.5)
    finally:
        alice.close()
        bob.close()


def test_anonymous_refused_on_non_loopback_by_default(tmp_path, brokers):
    # 0.0.0.0 is not loopback: anonymous clients are refused unless configured.
    toml = ('[[listener]]\nbind = "0.0.0.0:0"\n'
            '[[listener]]\nbind = "0.0.0.0:0"\nallow_anonymous = true\n'
            '[[listener]]\nbind = "127.0.0.1:0"\n')
    b = start_broker(tmp_path, toml, 3)
    brokers.append(b)
    for i, want5, want4 in [(0, 0x87, 5), (1, 0, 0), (2, 0, 0)]:
        port = b.listeners[i][1]
        for version, want in [(5, want5), (4, want4)]:
            raw = mqttraw.RawClient("127.0.0.1", port, version=version)
            ack = raw.connect("anon", expect_reason=None)
            assert ack.reason == want, (i, version, ack)
            raw.close()


def proxy_v1(src: str) -> bytes:
    return f"PROXY TCP4 {src} 127.0.0.1 40000 1883\r\n".encode()


def proxy_v2(src: str) -> bytes:
    body = socket.inet_aton(src) + socket.inet_aton("127.0.0.1") + struct.pack(">HH", 40000, 1883)
    return b"\r\n\r\n\0\r\nQUIT\n" + bytes([0x21, 0x11]) + struct.pack(">H", len(body)) + body


@pytest.mark.parametrize("header", [proxy_v1, proxy_v2], ids=["v1", "v2"])
def test_proxy_protocol_address_used_for_limits(tmp_path, brokers, header):
    toml = ('max_connection_rate = 1\n'
            '[[listener]]\nbind = "127.0.0.1:0"\nproxy_protocol = true\n')
    b = start_broker(tmp_path, toml, 1)
    brokers.append(b)
    port = b.listeners[0][1]

    def attempt(src):
        raw = mqttraw.RawClient("127.0.0.1", port, version=5)
        raw.send(header(src))
        ack = raw.connect("p" + src, expect_reason=None)
        raw.close()
        return ack.reason

    # One connection per second per address: the address is the proxied one.
    assert attempt("192.0.2.1") == 0
    assert attempt("192.0.2.2") == 0
    assert attempt("192.0.2.1") == 0x9F
    # Without a header the connection is dropped, and the broker goes on.
    raw = mqttraw.RawClient("127.0.0.1", port, version=5, timeout=5)
    raw.send(mqttraw.connect("nohdr"))
    with pytest.raises((ConnectionError, AssertionError, OSError, EOFError, mqttraw.ConnectionClosed)):
        raw.expect(mqttraw.CONNACK)
    raw.close()
    assert attempt("192.0.2.3") == 0


# ------------------------------------------------------------------ raw WebSocket

def ws_handshake(port, path="/mqtt", protocol="mqtt"):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    key = base64.b64encode(os.urandom(16)).decode()
    req = (f"GET {path} HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\n"
           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
           f"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: {protocol}\r\n\r\n")
    s.sendall(req.encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(1)
        if not chunk:
            break
        head += chunk
    return s, head.decode(errors="replace")


def ws_frame(payload: bytes, fin=True, opcode=2) -> bytes:
    mask = os.urandom(4)
    n = len(payload)
    first = (0x80 if fin else 0) | opcode
    if n < 126:
        hdr = bytes([first, 0x80 | n])
    else:
        hdr = bytes([first, 0x80 | 126]) + struct.pack(">H", n)
    return hdr + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def ws_read_messages(s, want_bytes: int) -> bytes:
    out = b""
    buf = b""
    while len(out) < want_bytes:
        chunk = s.recv(4096)
        if not chunk:
            break
        buf += chunk
        while len(buf) >= 2:
            n = buf[1] & 0x7F
            off = 2
            if n == 126:
                if len(buf) < 4:
                    break
                n = struct.unpack(">H", buf[2:4])[0]
                off = 4
            if len(buf) < off + n:
                break
            out += buf[off:off + n]
            buf = buf[off + n:]
    return out


def test_ws_packets_span_and_share_frames(tmp_path, brokers):
    toml = '[[listener]]\nbind = "127.0.0.1:0"\nprotocol = "websockets"\n'
    b = start_broker(tmp_path, toml, 1)
    brokers.append(b)
    port = b.listeners[0][1]
    s, head = ws_handshake(port)
    assert " 101 " in head and "sec-websocket-protocol: mqtt" in head.lower(), head
    connect = mqttraw.connect("wsraw", version=5)
    # CONNECT split over three frames (a fragmented message, then a second
    # message), then SUBSCRIBE + PINGREQ sharing one frame.
    s.sendall(ws_frame(connect[:3], fin=False) + ws_frame(connect[3:5], fin=True, opcode=0))
    s.sendall(ws_frame(connect[5:]))
    s.sendall(ws_frame(mqttraw.subscribe(1, [("a/b", 0)], version=5) + mqttraw.pingreq()))
    data = ws_read_messages(s, 4 + 6 + 2)
    assert data[0] == 0x20 and data[3] == 0, data  # CONNACK success
    # SUBACK and PINGRESP, in either order: with several shards the SUBACK
    # waits until every shard routes the filter (no ordering rule binds a
    # PINGRESP to an earlier SUBACK).
    suback, pingresp = b"\x90\x04\x00\x01\x00\x00", b"\xd0\x00"
    rest = data[2 + data[1]:]
    assert rest in (suback + pingresp, pingresp + suback), data
    s.close()
    # Wrong path: 404, no upgrade.
    s, head = ws_handshake(port, path="/other")
    assert " 404 " in head, head
    s.close()
    assert b.alive()
