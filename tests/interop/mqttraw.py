"""A small raw MQTT 3.1.1 / 5.0 client for the cases paho cannot express.

Encodes CONNECT, PUBLISH, PUBACK/PUBREC/PUBREL/PUBCOMP, SUBSCRIBE,
UNSUBSCRIBE, PINGREQ and DISCONNECT, and reads and decodes whatever the
broker sends back. Deliberately independent of the broker's own codec.
"""

from __future__ import annotations

import select
import socket
import struct
import time
from dataclasses import dataclass, field

CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP = 1, 2, 3, 4, 5, 6, 7
SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, PINGREQ, PINGRESP, DISCONNECT, AUTH = (
    8, 9, 10, 11, 12, 13, 14, 15,
)
NAMES = {
    1: "CONNECT", 2: "CONNACK", 3: "PUBLISH", 4: "PUBACK", 5: "PUBREC", 6: "PUBREL",
    7: "PUBCOMP", 8: "SUBSCRIBE", 9: "SUBACK", 10: "UNSUBSCRIBE", 11: "UNSUBACK",
    12: "PINGREQ", 13: "PINGRESP", 14: "DISCONNECT", 15: "AUTH",
}

# MQTT 5 property identifiers
PAYLOAD_FORMAT = 0x01
MESSAGE_EXPIRY = 0x02
CONTENT_TYPE = 0x03
RESPONSE_TOPIC = 0x08
CORRELATION_DATA = 0x09
SUBSCRIPTION_ID = 0x0B
SESSION_EXPIRY = 0x11
ASSIGNED_CLIENT_ID = 0x12
SERVER_KEEP_ALIVE = 0x13
AUTH_METHOD = 0x15
AUTH_DATA = 0x16
REQUEST_PROBLEM_INFO = 0x17
WILL_DELAY = 0x18
REQUEST_RESPONSE_INFO = 0x19
RESPONSE_INFO = 0x1A
SERVER_REFERENCE = 0x1C
REASON_STRING = 0x1F
RECEIVE_MAXIMUM = 0x21
TOPIC_ALIAS_MAXIMUM = 0x22
TOPIC_ALIAS = 0x23
MAXIMUM_QOS = 0x24
RETAIN_AVAILABLE = 0x25
USER_PROPERTY = 0x26
MAXIMUM_PACKET_SIZE = 0x27
WILDCARD_SUB_AVAILABLE = 0x28
SUB_ID_AVAILABLE = 0x29
SHARED_SUB_AVAILABLE = 0x2A

_BYTE = {PAYLOAD_FORMAT, REQUEST_PROBLEM_INFO, REQUEST_RESPONSE_INFO, MAXIMUM_QOS,
         RETAIN_AVAILABLE, WILDCARD_SUB_AVAILABLE, SUB_ID_AVAILABLE, SHARED_SUB_AVAILABLE}
_U16 = {SERVER_KEEP_ALIVE, RECEIVE_MAXIMUM, TOPIC_ALIAS_MAXIMUM, TOPIC_ALIAS}
_U32 = {MESSAGE_EXPIRY, SESSION_EXPIRY, WILL_DELAY, MAXIMUM_PACKET_SIZE}
_VARINT = {SUBSCRIPTION_ID}
_STR = {CONTENT_TYPE, RESPONSE_TOPIC, ASSIGNED_CLIENT_ID, AUTH_METHOD, RESPONSE_INFO,
        SERVER_REFERENCE, REASON_STRING}
_BIN = {CORRELATION_DATA, AUTH_DATA}


class ConnectionClosed(Exception):
    """The broker closed the connection."""


# ---------------------------------------------------------------- encoding

def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n % 128
        n //= 128
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def mqtt_str(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("!H", len(b)) + b


def encode_props(props: dict | list | None) -> bytes:
    """props: {id: value} (USER_PROPERTY / SUBSCRIPTION_ID values may be lists)
    or a list of (id, value) pairs, to control order and repetition."""
    if props is None:
        props = []
    items = []
    if isinstance(props, dict):
        for k, v in props.items():
            if k in (USER_PROPERTY, SUBSCRIPTION_ID) and isinstance(v, list):
                items.extend((k, x) for x in v)
            else:
                items.append((k, v))
    else:
        items = list(props)
    body = bytearray()
    for k, v in items:
        body += varint(k)
        if k in _BYTE:
            body.append(v)
        elif k in _U16:
            body += struct.pack("!H", v)
        elif k in _U32:
            body += struct.pack("!I", v)
        elif k in _VARINT:
            body += varint(v)
        elif k in _STR or k in _BIN:
            body += mqtt_str(v)
        elif k == USER_PROPERTY:
            body += mqtt_str(v[0]) + mqtt_str(v[1])
        else:
            raise ValueError(f"unknown property {k:#x}")
    return varint(len(body)) + bytes(body)


def packet(ptype: int, flags: int, body: bytes) -> bytes:
    return bytes([(ptype << 4) | flags]) + varint(len(body)) + body


def connect(client_id: str = "", version: int = 5, keepalive: int = 60, clean: bool = True,
            props: dict | list | None = None, will: dict | None = None,
            username: str | None = None, password: bytes | None = None) -> bytes:
    """will: {"topic", "payload", "qos", "retain", "props"}"""
    if version == 3:
        vh = mqtt_str("MQIsdp") + bytes([3])
    else:
        vh = mqtt_str("MQTT") + bytes([version])
    flags = 0
    if clean:
        flags |= 0x02
    if will:
        flags |= 0x04 | (will.get("qos", 0) << 3) | (0x20 if will.get("retain") else 0)
    if password is not None:
        flags |= 0x40
    if username is not None:
        flags |= 0x80
    vh += bytes([flags]) + struct.pack("!H", keepalive)
    if version == 5:
        vh += encode_props(props)
    pl = mqtt_str(client_id)
    if will:
        if version == 5:
            pl += encode_props(will.get("props"))
        pl += mqtt_str(will["topic"]) + mqtt_str(will.get("payload", b""))
    if username is not None:
        pl += mqtt_str(username)
    if password is not None:
        pl += mqtt_str(password)
    return packet(CONNECT, 0, vh + pl)


def publish(topic: str | bytes, payload: bytes = b"", qos: int = 0, retain: bool = False,
            dup: bool = False, packet_id: int | None = None, version: int = 5,
            props: dict | list | None = None) -> bytes:
    flags = (qos << 1) | (1 if retain else 0) | (0x08 if dup else 0)
    body = mqtt_str(topic)
    if qos > 0:
        body += struct.pack("!H", packet_id if packet_id is not None else 1)
    if version == 5:
        body += encode_props(props)
    return packet(PUBLISH, flags, body + payload)


def ack(ptype: int, packet_id: int, version: int = 5, reason: int = 0,
        props: dict | None = None) -> bytes:
    """PUBACK / PUBREC / PUBREL / PUBCOMP."""
    flags = 0x02 if ptype == PUBREL else 0
    body = struct.pack("!H", packet_id)
    if version == 5 and (reason or props):
        body += bytes([reason])
        if props:
            body += encode_props(props)
    return packet(ptype, flags, body)


def subscribe(packet_id: int, filters, version: int = 5, props: dict | None = None) -> bytes:
    """filters: list of (filter, options byte) or (filter, qos, nl, rap, rh)."""
    body = struct.pack("!H", packet_id)
    if version == 5:
        body += encode_props(props)
    for f in filters:
        if len(f) == 2:
            flt, opts = f
        else:
            flt, qos, nl, rap, rh = f
            opts = qos | (0x04 if nl else 0) | (0x08 if rap else 0) | (rh << 4)
        body += mqtt_str(flt) + bytes([opts])
    return packet(SUBSCRIBE, 0x02, body)


def unsubscribe(packet_id: int, filters, version: int = 5) -> bytes:
    body = struct.pack("!H", packet_id)
    if version == 5:
        body += encode_props(None)
    for f in filters:
        body += mqtt_str(f)
    return packet(UNSUBSCRIBE, 0x02, body)


def pingreq() -> bytes:
    return packet(PINGREQ, 0, b"")


def disconnect(version: int = 5, reason: int = 0, props: dict | None = None) -> bytes:
    if version == 5 and (reason or props):
        return packet(DISCONNECT, 0, bytes([reason]) + encode_props(props))
    return packet(DISCONNECT, 0, b"")


# ---------------------------------------------------------------- decoding

@dataclass
class Packet:
    type: int
    flags: int
    body: bytes
    version: int = 5
    # decoded fields (when they apply)
    reason: int | None = None
    session_present: bool | None = None
    packet_id: int | None = None
    topic: bytes | None = None
    payload: bytes | None = None
    qos: int = 0
    retain: bool = False
    dup: bool = False
    reasons: list = field(default_factory=list)
    props: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return NAMES.get(self.type, str(self.type))

    def prop(self, pid, default=None):
        return self.props.get(pid, default)

    def __repr__(self):
        extra = []
        for attr in ("reason", "session_present", "packet_id", "topic", "qos", "retain", "dup"):
            v = getattr(self, attr)
            if v not in (None, False, 0):
                extra.append(f"{attr}={v!r}")
        if self.payload is not None:
            extra.append(f"payload={self.payload[:40]!r}")
        if self.reasons:
            extra.append(f"reasons={self.reasons}")
        if self.props:
            extra.append(f"props={self.props}")
        return f"<{self.name} {' '.join(extra)}>"


def decode_varint(buf: bytes, pos: int) -> tuple[int, int]:
    mult, value = 1, 0
    for i in range(4):
        b = buf[pos + i]
        value += (b & 0x7F) * mult
        if not b & 0x80:
            return value, pos + i + 1
        mult *= 128
    raise ValueError("varint too long")


def decode_props(buf: bytes, pos: int) -> tuple[dict, int]:
    length, pos = decode_varint(buf, pos)
    end = pos + length
    props: dict = {}
    while pos < end:
        pid, pos = decode_varint(buf, pos)
        if pid in _BYTE:
            v = buf[pos]
            pos += 1
        elif pid in _U16:
            (v,) = struct.unpack_from("!H", buf, pos)
            pos += 2
        elif pid in _U32:
            (v,) = struct.unpack_from("!I", buf, pos)
            pos += 4
        elif pid in _VARINT:
            v, pos = decode_varint(buf, pos)
        elif pid in _STR or pid in _BIN:
            (n,) = struct.unpack_from("!H", buf, pos)
            v = bytes(buf[pos + 2:pos + 2 + n])
            if pid in _STR:
                v = v.decode()
            pos += 2 + n
        elif pid == USER_PROPERTY:
            (n,) = struct.unpack_from("!H", buf, pos)
            k = bytes(buf[pos + 2:pos + 2 + n]).decode()
            pos += 2 + n
            (n,) = struct.unpack_from("!H", buf, pos)
            val = bytes(buf[pos + 2:pos + 2 + n]).decode()
            pos += 2 + n
            props.setdefault(USER_PROPERTY, []).append((k, val))
            continue
        else:
            raise ValueError(f"unknown property id {pid:#x}")
        if pid == SUBSCRIPTION_ID:
            props.setdefault(SUBSCRIPTION_ID, []).append(v)
        else:
            props[pid] = v
    return props, end


def decode(ptype: int, flags: int, body: bytes, version: int) -> Packet:
    p = Packet(ptype, flags, body, version)
    v5 = version == 5
    if ptype == CONNACK:
        p.session_present = bool(body[0] & 1)
        p.reason = body[1]
        if v5 and len(body) > 2:
            p.props, _ = decode_props(body, 2)
    elif ptype == PUBLISH:
        p.qos = (flags >> 1) & 3
        p.retain = bool(flags & 1)
        p.dup = bool(flags & 8)
        (n,) = struct.unpack_from("!H", body, 0)
        p.topic = bytes(body[2:2 + n])
        pos = 2 + n
        if p.qos:
            (p.packet_id,) = struct.unpack_from("!H", body, pos)
            pos += 2
        if v5:
            p.props, pos = decode_props(body, pos)
        p.payload = bytes(body[pos:])
    elif ptype in (PUBACK, PUBREC, PUBREL, PUBCOMP, UNSUBACK, SUBACK):
        (p.packet_id,) = struct.unpack_from("!H", body, 0)
        pos = 2
        if ptype in (SUBACK, UNSUBACK):
            if v5:
                p.props, pos = decode_props(body, pos)
            p.reasons = list(body[pos:])
        else:
            p.reason = body[2] if len(body) > 2 else 0
            if v5 and len(body) > 3:
                p.props, _ = decode_props(body, 3)
    elif ptype in (DISCONNECT, AUTH):
        p.reason = body[0] if body else 0
        if v5 and len(body) > 1:
            p.props, _ = decode_props(body, 1)
    return p


class RawClient:
    """A blocking socket speaking raw MQTT. Every read has a deadline."""

    def __init__(self, host: str, port: int, version: int = 5, timeout: float = 10.0):
        self.version = version
        self.timeout = timeout
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()
        self.closed = False

    # -- io
    def send(self, data: bytes):
        self.sock.sendall(data)

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def _fill(self, deadline: float) -> None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("no packet from broker before the deadline")
        r, _, _ = select.select([self.sock], [], [], remaining)
        if not r:
            raise TimeoutError("no packet from broker before the deadline")
        try:
            data = self.sock.recv(65536)
        except (ConnectionResetError, ConnectionAbortedError):
            data = b""
        if not data:
            self.closed = True
            raise ConnectionClosed("connection closed by broker")
        self.buf += data

    def recv(self, timeout: float | None = None) -> Packet:
        """Next packet; raises TimeoutError or ConnectionClosed."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            if len(self.buf) >= 2:
                try:
                    length, pos = decode_varint(self.buf, 1)
                except IndexError:
                    length = None
                if length is not None and len(self.buf) >= pos + length:
                    first = self.buf[0]
                    body = bytes(self.buf[pos:pos + length])
                    del self.buf[:pos + length]
                    return decode(first >> 4, first & 0x0F, body, self.version)
            self._fill(deadline)

    def expect(self, ptype: int, timeout: float | None = None, skip=()) -> Packet:
        """Next packet, which must be of type ptype (types in skip are ignored)."""
        while True:
            p = self.recv(timeout)
            if p.type in skip:
                continue
            assert p.type == ptype, f"expected {NAMES[ptype]}, got {p!r}"
            return p

    def recv_until_closed(self, timeout: float | None = None) -> list[Packet]:
        """All packets until the broker closes the connection (TimeoutError if it doesn't)."""
        got = []
        while True:
            try:
                got.append(self.recv(timeout))
            except ConnectionClosed:
                return got

    def assert_silent(self, duration: float = 0.5):
        """Nothing arrives (and the connection stays open) for `duration` seconds."""
        try:
            p = self.recv(duration)
        except TimeoutError:
            return
        raise AssertionError(f"unexpected packet {p!r}")

    # -- protocol
    def connect(self, client_id: str = "", keepalive: int = 60, clean: bool = True,
                props=None, will=None, expect_reason: int | None = 0, **kw) -> Packet:
        self.send(connect(client_id, self.version, keepalive, clean, props, will, **kw))
        ack_ = self.expect(CONNACK)
        if expect_reason is not None:
            assert ack_.reason == expect_reason, f"CONNACK {ack_!r}"
        return ack_

    def subscribe(self, filters, packet_id: int = 1, props=None) -> Packet:
        if isinstance(filters, str):
            filters = [(filters, 1)]
        self.send(subscribe(packet_id, filters, self.version, props))
        return self.expect(SUBACK)

    def publish(self, topic, payload=b"", qos=0, retain=False, packet_id=1, props=None,
                dup=False) -> Packet | None:
        """Publish; for QoS 1/2 complete the flow and return the final ack."""
        self.send(publish(topic, payload, qos, retain, dup, packet_id, self.version, props))
        if qos == 1:
            return self.expect(PUBACK)
        if qos == 2:
            rec = self.expect(PUBREC)
            assert rec.packet_id == packet_id
            self.send(ack(PUBREL, packet_id, self.version))
            return self.expect(PUBCOMP)
        return None

    def ping(self) -> None:
        self.send(pingreq())
        self.expect(PINGRESP)

    def disconnect(self, reason: int = 0, props=None) -> None:
        self.send(disconnect(self.version, reason, props))
        self.close()


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")
