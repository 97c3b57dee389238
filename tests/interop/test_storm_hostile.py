"""A storm of 1,000 clients, and hostile clients."""

import asyncio
import random
import resource
import socket
import struct
import time

import pytest

import mqttraw as r
from brokerenv import IS_ZEROFAN

STORM_CLIENTS = 1000
STORM_DEADLINE = 120.0  # seconds for one whole round on a loaded 2-core machine


async def _read_packet(reader, version):
    first = (await reader.readexactly(1))[0]
    mult, length = 1, 0
    while True:
        b = (await reader.readexactly(1))[0]
        length += (b & 0x7F) * mult
        if not b & 0x80:
            break
        mult *= 128
    body = await reader.readexactly(length) if length else b""
    return r.decode(first >> 4, first & 0x0F, body, version)


async def _storm_round(host, port, n, tag, connect_sem):
    """n clients: connect, subscribe to their own topic, publish QoS 1 to the next
    one's topic, receive the previous one's message, disconnect."""
    conns = []

    async def open_one(i):
        version = 5 if i % 2 else 4
        async with connect_sem:
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(r.connect(f"storm-{tag}-{i}", version=version, keepalive=120))
            ack = await _read_packet(reader, version)
            assert ack.type == r.CONNACK and ack.reason == 0, ack
            writer.write(r.subscribe(1, [(f"storm/{tag}/{i}", 1)], version))
            sub = await _read_packet(reader, version)
            assert sub.type == r.SUBACK and sub.reasons == [1], sub
        conns.append((i, version, reader, writer))

    await asyncio.gather(*(open_one(i) for i in range(n)))

    async def exchange(i, version, reader, writer):
        writer.write(r.publish(f"storm/{tag}/{(i + 1) % n}", f"from-{i}".encode(), 1,
                               packet_id=10, version=version))
        got, acked = None, False
        while got is None or not acked:
            p = await _read_packet(reader, version)
            if p.type == r.PUBACK:
                assert p.packet_id == 10
                acked = True
            elif p.type == r.PUBLISH:
                assert got is None, f"client {i} got a second message {p!r}"
                got = p.payload
                writer.write(r.ack(r.PUBACK, p.packet_id, version))
            else:
                raise AssertionError(f"client {i}: unexpected {p!r}")
        writer.write(r.disconnect(version))
        await writer.drain()
        writer.close()
        return i, got

    results = await asyncio.gather(*(exchange(*c) for c in conns))
    for i, got in results:
        assert got == f"from-{(i - 1) % n}".encode(), (i, got)


def _run_storm(broker, n, tag):
    async def main():
        sem = asyncio.Semaphore(100)
        await asyncio.wait_for(_storm_round(broker.host, broker.port, n, tag, sem),
                               STORM_DEADLINE)
    start = time.monotonic()
    asyncio.run(main())
    return time.monotonic() - start


def _settled_rss(broker, seconds=2.0):
    """RSS once the broker has finished tearing connections down (bounded wait)."""
    time.sleep(seconds)  # let closed connections be reaped; there is no event for it
    return r.rss_kib(broker.pid)


def test_storm(broker, client_factory):
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert soft >= STORM_CLIENTS + 200, f"open-file limit {soft} is too low for the storm"
    observer = client_factory(broker, version=5)
    observer.subscribe("storm/#", 1)
    _run_storm(broker, 50, "warm")  # warm up pools, allocator arenas, tables
    observer.expect_messages(50)
    base = _settled_rss(broker)
    took1 = _run_storm(broker, STORM_CLIENTS, "one")
    assert len(observer.expect_messages(STORM_CLIENTS, timeout=30)) == STORM_CLIENTS
    after1 = _settled_rss(broker)
    took2 = _run_storm(broker, STORM_CLIENTS, "two")
    assert len(observer.expect_messages(STORM_CLIENTS, timeout=30)) == STORM_CLIENTS
    after2 = _settled_rss(broker)
    print(f"storm: {took1:.1f}s and {took2:.1f}s for {STORM_CLIENTS} clients; "
          f"RSS {base} -> {after1} -> {after2} KiB")
    # a second identical round must not grow memory: nothing is kept per client
    assert after2 - after1 < 8 * 1024, f"RSS grew {after2 - after1} KiB in round two"
    assert after2 - base < 48 * 1024, f"RSS {base} -> {after2} KiB after the storm"
    observer.publish("storm/check", b"alive", 1)
    assert observer.expect_message().payload == b"alive"


def _assert_broker_serves(broker, client_factory):
    assert broker.alive(), "broker died"
    c = client_factory(broker, version=5)
    c.subscribe("after/hostile", 1)
    c.publish("after/hostile", b"ok", 1)
    assert c.expect_message().payload == b"ok"


def _closes_within(sock, seconds):
    sock.settimeout(seconds)
    try:
        while sock.recv(65536):
            pass
        return True
    except socket.timeout:
        return False
    except (ConnectionResetError, BrokenPipeError):
        return True


def test_random_bytes(broker, client_factory):
    rng = random.Random(20261121)
    for i in range(40):
        s = socket.create_connection(broker.addr, timeout=10)
        junk = bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 4096)))
        if junk[0] >> 4 == r.CONNECT:
            junk = b"\xf0" + junk[1:]  # not a CONNECT: the broker must hang up
        try:
            s.sendall(junk)
        except (ConnectionResetError, BrokenPipeError):
            pass
        assert _closes_within(s, 10), f"connection {i} not closed after junk"
        s.close()
    # junk after a valid CONNECT
    for i in range(20):
        c = r.RawClient(broker.host, broker.port, 5 if i % 2 else 4)
        c.connect(f"junk-{i}")
        try:
            c.send(bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 4096))))
        except (ConnectionResetError, BrokenPipeError):
            pass
        c.close()
    _assert_broker_serves(broker, client_factory)


def test_truncated_packets(broker, client_factory):
    full_connect = r.connect("trunc", version=5)
    pieces = [
        full_connect[:5],                          # CONNECT cut short
        b"\x10",                                   # a fixed header alone
        b"\x10\xff",                               # remaining length cut short
        full_connect + r.publish("t/x", b"y" * 100, 1)[:20],   # PUBLISH cut short
        full_connect + r.subscribe(1, [("a/b", 1)])[:6],      # SUBSCRIBE cut short
    ]
    for data in pieces:
        s = socket.create_connection(broker.addr, timeout=10)
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)  # the client is gone mid-packet
        assert _closes_within(s, 10)
        s.close()
    _assert_broker_serves(broker, client_factory)


@pytest.mark.parametrize("after_connect", [False, True], ids=["before-connect", "after-connect"])
def test_huge_remaining_length(broker, client_factory, after_connect):
    """A header announcing 268 MB: nothing like that is allocated up front."""
    base = r.rss_kib(broker.pid)
    s = socket.create_connection(broker.addr, timeout=10)
    if after_connect:
        s.sendall(r.connect("huge", version=5))
        s.recv(64)  # CONNACK
        s.sendall(b"\x30\xff\xff\xff\x7f" + struct.pack("!H", 3) + b"a/b" + b"\x00" * 65536)
    else:
        s.sendall(b"\x10\xff\xff\xff\x7f" + b"\x00" * 65536)
    # the broker either refuses it (closes) or waits for the body; either way cheaply
    closed = _closes_within(s, 1.0)
    grown = r.rss_kib(broker.pid) - base
    assert grown < 64 * 1024, f"RSS grew {grown} KiB on a 268 MB header"
    s.close()
    if IS_ZEROFAN and not after_connect:
        assert closed, "a CONNECT larger than any sane CONNECT must be refused at once"
    _assert_broker_serves(broker, client_factory)


def test_remaining_length_five_bytes(broker, client_factory, raw_factory):
    c = raw_factory(broker, 5)
    c.connect("varint5")
    c.send(b"\x30\xff\xff\xff\xff\x01")  # a varint may have at most 4 bytes
    pkts = c.recv_until_closed()
    got = [p.reason for p in pkts if p.type == r.DISCONNECT]
    assert got in ([0x81], []) if not IS_ZEROFAN else got == [0x81], pkts
    _assert_broker_serves(broker, client_factory)


def test_slow_connect(broker, client_factory):
    """A CONNECT dripped one byte every 0.2 s completes; others are served meanwhile."""
    data = r.connect("slowpoke", version=4, keepalive=30)
    s = socket.create_connection(broker.addr, timeout=10)
    for i, b in enumerate(data):
        s.send(bytes([b]))
        if i == len(data) // 2:  # the broker serves others during the drip
            _assert_broker_serves(broker, client_factory)
        time.sleep(0.2)  # the drip rate is the behaviour under test
    s.settimeout(10)
    ack = s.recv(4)
    assert ack == b"\x20\x02\x00\x00", ack
    s.close()
    _assert_broker_serves(broker, client_factory)


def test_connect_timeout(broker_factory, client_factory):
    """A connection that never completes its CONNECT is closed after connect_timeout,
    also when it trickles bytes to look alive."""
    b = broker_factory(connect_timeout=1)
    idle = socket.create_connection(b.addr, timeout=10)
    start = time.monotonic()
    assert _closes_within(idle, 10)
    assert time.monotonic() - start < 5
    data = r.connect("trickle", version=4)
    drip = socket.create_connection(b.addr, timeout=10)
    start = time.monotonic()
    closed = False
    for byte in data[:-1]:
        try:
            drip.send(bytes([byte]))
        except (ConnectionResetError, BrokenPipeError):
            closed = True
            break
        time.sleep(0.3)  # the drip rate is the behaviour under test
        if time.monotonic() - start > 4:
            break
    closed = closed or _closes_within(drip, 3)
    assert closed, "a trickled CONNECT outlived connect_timeout"
    _assert_broker_serves(b, client_factory)
