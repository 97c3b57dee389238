#!/usr/bin/env python3
"""A long cluster run with faults, checked in the style of Jepsen: the
longer counterpart of `test_cluster.py` (BENCHMARKS.md, "Cluster: a long
run with faults").

    ZEROFAN_BIN=target/release/zerofan \\
        python3 tests/interop/cluster_soak.py --seconds 300 --seed 1

Three nodes, every node-to-node connection through a proxy. Persistent
subscribers (MQTT 5 and 3.1.1, on different nodes) and QoS 1 and QoS 2
publishers on every node publish all along. One fault at a time, chosen
by the seed, the cluster healthy again before the next:

- kill: a node killed (`kill -9`) and restarted from its data dir 1-3 s later
  (`--down-max`);
- pause: a node stopped (SIGSTOP) for 1-5 s, past its lease, then resumed;
- cut: a node cut off from the others by the proxy for 2-6 s (`--cut-max`), then
  healed;
- move: a subscriber leaves its node and connects to the next one;
- split (only with `--faults ...,split`): a node and the next one cut from
  each other for 2-6 s, both still reaching the third.

Will clients (three clean 3.1.1 ones, and two MQTT 5 ones of persistent
sessions whose wills have a delay of 60 s, coming back alternately with a
clean start and to resume) reconnect whenever their connection ends, and at
each move one of the two MQTT 5 ones takes its session over on the next node
while connected; each will must come at most once, and not for a session
resumed within its delay. Clients reconnect to the next live node, as a client given several servers
would (one paho client per subscriber throughout, so a QoS 2 delivery past
PUBREC completes on the next node). At the end the faults stop and every
promise is checked: each acknowledged QoS 1/2 message at every subscriber,
each QoS 2 message at most once, each publisher's order (of first
deliveries: QoS 1 may repeat what was in flight at a fault). Prints one line
of figures; exits 1 on a broken promise. Servers listen on 127.0.0.1 only;
the run is bounded by --seconds (plus at most two minutes to settle).
"""

from __future__ import annotations

import argparse
import collections
import datetime
import os
import random
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cluster_check import History, parse, payload  # noqa: E402
from conftest import free_port  # noqa: E402
import mqttraw  # noqa: E402
from paho.mqtt.packettypes import PacketTypes  # noqa: E402
from pahoclient import PahoClient, props  # noqa: E402
from test_cluster import (  # noqa: E402
    Node, Partitioner, _acked, _persistent, metric, status, voters_with_leader)

SETTLE = 60.0


def drop(c: PahoClient):
    """Close a client's socket without a DISCONNECT."""
    try:
        c.c.loop_stop()
        sock = c.c.socket()
        if sock is not None:
            sock.close()
    except Exception:
        pass


def shut(c: PahoClient):
    """Close a client and its socket: paho closes it in its loop, which a
    stopped client no longer runs, and a long run must not pile up
    sockets (paho waits on `select`, which takes descriptors below 1024)."""
    c.close()
    drop(c)


def live(nodes: list[Node]) -> list[Node]:
    return [n for n in nodes if n.broker is not None and n.broker.alive()]


def healthy(nodes: list[Node], timeout: float) -> bool:
    """Every member a healthy voter, one leader (polled: no event to wait
    on across processes)."""
    deadline = time.monotonic() + timeout
    ok = voters_with_leader(len(nodes))
    while time.monotonic() < deadline:
        for n in live(nodes):
            s = status(n)
            if s is not None and ok(s):
                return True
        time.sleep(0.2)
    return False


class Sub(threading.Thread):
    """A persistent subscriber of soak/#, QoS 2, that reconnects to the next
    live node whenever its connection ends."""

    def __init__(self, name: str, version: int, first: int, nodes: list[Node], h: History,
                 topic_filter: str = "soak/#"):
        super().__init__(daemon=True)
        self.name, self.version, self.nodes, self.h = name, version, nodes, h
        self.at = first
        self.stop = threading.Event()
        self.errors: list[str] = []
        self.reconnects = 0
        # (time, node id, session present) of each connection served.
        self.served: list[tuple[float, int, bool]] = []
        # (time, node id, CONNACK code or error) of each refused attempt.
        self.refused: list[tuple[float, int, str]] = []
        self.lock = threading.Lock()
        # (time, node id) of each message received, as `h.received` lists them.
        self.arrivals: list[tuple[float, int]] = []
        self.c = _persistent(nodes[first], name, version, connect=False)
        self.c.c.on_message = self._on_message
        # paho's own log of packets sent and received (the last ones), for
        # a client that cannot connect.
        self.trace: collections.deque = collections.deque(maxlen=40)
        self.c.c.on_log = lambda _c, _u, _l, buf: self.trace.append((time.monotonic(), buf))
        self._connect()
        assert self.c.subscribe(topic_filter, 2) == [2]

    def _on_message(self, client, userdata, msg):
        with self.lock:
            self.h.received[self.name].append(msg.payload)
            node = self.served[-1][1] if self.served else 0
            self.arrivals.append((time.monotonic(), node))

    def _connect(self):
        """Connect to the node at `self.at` or the next ones, retrying while
        the cluster refuses (0x88 / 3 during a failover) or a node is down
        (bounded)."""
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not self.stop.is_set():
            node = self.nodes[self.at % len(self.nodes)]
            if node.broker is not None and node.broker.alive():
                self._fresh(node)
                try:
                    present, rc, _ = self.c.connect(expect_rc=None)
                    why = f"{rc:#x}"
                except Exception as e:  # refused, reset, no CONNACK in time
                    rc, why = -1, type(e).__name__
                if rc == 0:
                    self.served.append((time.monotonic(), node.node_id, bool(present)))
                    return
                self.refused.append((time.monotonic(), node.node_id, why))
            self.at += 1
            self.stop.wait(0.2)
        if not self.stop.is_set():
            raise AssertionError(f"{self.name}: no node served it for 90 s")

    def _fresh(self, node: Node):
        """A new paho client for the next attempt: one reused after a
        refused CONNACK was seen to send its next CONNECT and never read an
        answer. The QoS 2 messages it received and has not seen released
        go with it, as paho keeps them per client."""
        old = self.c
        shut(old)
        self.c = _persistent(node, self.name, self.version, connect=False)
        self.c.c._in_messages = old.c._in_messages
        self.c.c.on_message = self._on_message
        self.c.c.on_log = old.c.on_log

    def move(self):
        """Leave this node (DISCONNECT): `run` connects to the next one."""
        self.c.c.disconnect()

    def run(self):
        while not self.stop.is_set():
            try:
                self.c.disconnects.get(timeout=0.2)
            except Exception:
                continue
            self.reconnects += 1
            self.at += 1
            try:
                self._connect()
            except Exception as e:
                self.errors.append(f"{self.name}: {e!r}")
                return

    def count(self, who: str, seqs: set[int]) -> int:
        with self.lock:
            got = {parse(p) for p in self.h.received[self.name]}
        return sum(1 for s in seqs if (who, s) in got)


class Pub(threading.Thread):
    """Publishes `who:i` on soak/WHO at `qos`, each waited for, every 20 ms;
    a message not acknowledged in 10 s (its node down, paused, cut off) is
    given up and the publisher reconnects to the next live node."""

    def __init__(self, who: str, qos: int, first: int, nodes: list[Node], h: History,
                 limit: int):
        super().__init__(daemon=True)
        self.who, self.qos, self.nodes, self.h, self.limit = who, qos, nodes, h, limit
        self.at = first
        self.stop = threading.Event()
        self.given_up = 0
        self.errors: list[str] = []
        # The first number sent on each connection: order is promised
        # within one connection only.
        self.conns: list[int] = []
        self.sent_at: dict[int, float] = {}
        # The node each message was published at.
        self.sent_to: dict[int, int] = {}
        self.node = 0
        h.qos[who] = qos

    def _client(self) -> PahoClient | None:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not self.stop.is_set():
            node = self.nodes[self.at % len(self.nodes)]
            if node.broker is not None and node.broker.alive():
                c = PahoClient(node.broker, client_id=self.who, connect=False)
                try:
                    _, rc, _ = c.connect(expect_rc=None)
                except Exception:  # refused, reset, no CONNACK in time
                    rc = -1
                if rc == 0:
                    self.node = node.node_id
                    return c
                shut(c)
            self.at += 1
            self.stop.wait(0.2)
        if not self.stop.is_set():
            self.errors.append(f"{self.who}: no node served it for 90 s")
        return None

    def run(self):
        c = self._client()
        i = 0
        self.conns.append(i)
        while c is not None and not self.stop.is_set() and i < self.limit:
            self.sent_at[i] = time.monotonic()
            self.sent_to[i] = self.node
            info = c.c.publish(f"soak/{self.who}", payload(self.who, i), self.qos)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not _acked(info):
                try:
                    info.wait_for_publish(0.1)
                except Exception:
                    pass
                if not c.disconnects.empty():
                    break
            if _acked(info):
                self.h.acked[self.who].add(i)
            else:
                self.given_up += 1
                shut(c)
                self.at += 1
                c = self._client()
                self.conns.append(i + 1)
            i += 1
            self.stop.wait(0.02)
        if c is not None:
            shut(c)


class WillClient(threading.Thread):
    """A clean client (3.1.1 clean session 1) with a QoS 2 will on
    soak-will/NAME whose payload names its connection (NAME:K). It never
    disconnects of itself until the end (a normal DISCONNECT, no will), and
    reconnects to the next live node whenever its connection ends; a
    short keep alive finds a paused node.

    `delayed`: an MQTT 5 client of a persistent session (expiry 3600 s)
    whose will has a delay of 60 s instead. Its connections alternate: an
    odd one resumes the session, which cancels the will of the one before
    (back within the delay), and an even one starts clean, which ends the
    session and makes that will due at once (MQTT-3.1.3-9). K counts its
    CONNECTs; one with no CONNACK is abandoned (`abandoned`), its will
    not judged."""

    def __init__(self, name: str, first: int, nodes: list[Node], delayed: bool = False):
        super().__init__(daemon=True)
        self.name, self.nodes, self.at, self.delayed = name, nodes, first, delayed
        self.stop = threading.Event()
        self.errors: list[str] = []
        # [start, end or None, node id, K, clean start] of each connection.
        self.conns: list[list] = []
        self.tries = 0
        self.abandoned: set[bytes] = set()
        self.jumping = threading.Event()
        self.jumps = 0

    def jump(self):
        """Connect to the next node while connected (a takeover: the old
        connection ends with DISCONNECT 0x8E, its will judged as a lost
        connection's); a delayed client only."""
        if self.delayed:
            self.jumps += 1
            self.jumping.set()

    def _connect(self, node: Node, k: int, clean: bool) -> PahoClient:
        will = {"topic": f"soak-will/{self.name}", "payload": f"{self.name}:{k}".encode(),
                "qos": 2}
        if not self.delayed:
            return PahoClient(node.broker, client_id=self.name, version=311, keepalive=5,
                              connect=False, will=will)
        will["props"] = props(PacketTypes.WILLMESSAGE, WillDelayInterval=60)
        return PahoClient(node.broker, client_id=self.name, keepalive=5, clean=clean,
                          connect=False, will=will,
                          connect_props=props(PacketTypes.CONNECT, SessionExpiryInterval=3600))

    def _client(self) -> PahoClient | None:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not self.stop.is_set():
            node = self.nodes[self.at % len(self.nodes)]
            if node.broker is not None and node.broker.alive():
                k = self.tries
                self.tries += 1
                clean = len(self.conns) % 2 == 0
                c = self._connect(node, k, clean)
                try:
                    present, rc, _ = c.connect(expect_rc=None)
                except Exception:  # refused, reset, no CONNACK in time
                    present, rc = False, -1
                if rc == 0:
                    if self.delayed and not clean and not present:
                        self.errors.append(f"{self.name}:{k} at node {node.node_id}: "
                                           "its session was not present")
                    self.conns.append([time.monotonic(), None, node.node_id, k, clean])
                    return c
                if rc == -1:
                    self.abandoned.add(f"{self.name}:{k}".encode())
                shut(c)
            self.at += 1
            self.stop.wait(0.2)
        if not self.stop.is_set():
            self.errors.append(f"{self.name}: no node served it for 90 s")
        return None

    def run(self):
        c = self._client()
        while c is not None and not self.stop.is_set():
            if self.jumping.is_set():
                self.jumping.clear()
                self.conns[-1][1] = time.monotonic()
                self.at += 1
                old, c = c, self._client()
                # Taken over: closed without a DISCONNECT of its own.
                drop(old)
                continue
            try:
                c.disconnects.get(timeout=0.2)
            except Exception:
                continue
            self.conns[-1][1] = time.monotonic()
            shut(c)
            self.at += 1
            c = self._client()
        if c is not None:
            shut(c)


def will_problems(received: list[bytes], clients: list[WillClient]) -> tuple[list[str], list[str]]:
    """Each connection's will at most once, none of a connection closed
    normally (the last, at the end); and the wills of connections that
    ended abnormally after lasting 3 s that never came (reported apart: a
    node that lost its lease drops its clients without their wills, and
    comes back owning their ids when no node took them meanwhile)."""
    counts = Counter(received)
    out, missing = [], []
    for w in clients:
        for i, (start, end, node, k, _) in enumerate(w.conns):
            n = counts.pop(f"{w.name}:{k}".encode(), 0)
            if n > 1:
                out.append(f"will {w.name}:{k} (node {node}) published {n} times")
            if end is None and n:
                out.append(f"will {w.name}:{k} (node {node}) of a connection closed normally")
            if end is None or not w.delayed:
                if end is not None and n == 0 and end - start >= 3:
                    missing.append(f"{w.name}:{k} node {node}")
                continue
            after = w.conns[i + 1] if i + 1 < len(w.conns) else None
            if after is not None and after[4] and n == 0 and end - start >= 3:
                missing.append(f"{w.name}:{k} node {node} (a clean start ended it)")
            if after is not None and not after[4] and n and after[0] - end < 50:
                out.append(f"will {w.name}:{k} (node {node}) published although its "
                           f"session resumed {after[0] - end:.1f} s later (delay 60 s)")
        for p in w.abandoned:
            counts.pop(p, None)
    out += [f"will {p!r} of no connection" for p in counts]
    return out, missing


def wills_due(clients: list[WillClient]) -> set[bytes]:
    """The wills that must come: of each connection that ended otherwise
    than by a DISCONNECT, where its session ended (a clean client's, or a
    delayed one's whose next connection started clean)."""
    due = set()
    for w in clients:
        for i, (_, end, _, k, _) in enumerate(w.conns):
            after = w.conns[i + 1] if i + 1 < len(w.conns) else None
            if end is not None and (not w.delayed or (after is not None and after[4])):
                due.add(f"{w.name}:{k}".encode())
    return due


def problems(h: History, subs: list[str], conns: dict[str, list[int]]) -> list[str]:
    """The checker's promises, order judged on first deliveries (a QoS 1
    message in flight at a fault is delivered again after later ones) and
    within each publisher connection (`conns`: the first number of each)."""
    out = []

    def conn_of(who: str, seq: int) -> int:
        return sum(1 for first in conns.get(who, []) if first <= seq)

    for sub in subs:
        got = [parse(p) for p in h.received.get(sub, [])]
        counts = Counter(got)
        last: dict[tuple[str, int], int] = {}
        seen = set()
        for who, seq in got:
            if who not in h.qos:
                out.append(f"{sub}: {who}:{seq} was never published")
                continue
            if (who, seq) in seen:
                continue
            seen.add((who, seq))
            key = (who, conn_of(who, seq))
            if seq < last.get(key, -1):
                out.append(f"{sub}: {who}:{seq} after {who}:{last[key]} (order)")
            last[key] = max(seq, last.get(key, -1))
        for who, seqs in h.acked.items():
            missing = sorted(s for s in seqs if counts[(who, s)] == 0)
            if missing:
                out.append(f"{sub}: {len(missing)} acknowledged messages of {who} missing, "
                           f"first {missing[:5]}")
        for (who, seq), n in counts.items():
            if n > 1 and h.qos.get(who) == 2:
                out.append(f"{sub}: QoS 2 message {who}:{seq} {n} times")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=300)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cut-max", type=float, default=6,
                    help="longest partition, seconds (past 10 s the leader hands a cut-off "
                         "node's client ids to another node)")
    ap.add_argument("--down-max", type=float, default=3,
                    help="longest time a killed node stays down, seconds (likewise)")
    ap.add_argument("--faults", default="kill,pause,cut,move",
                    help="the kinds of fault to draw from, among kill, pause, cut, move and "
                         "split (two nodes cut from each other only, 2 s to --cut-max)")
    ap.add_argument("--hold", type=float, default=0,
                    help="seconds to keep the cluster up after a broken promise, to look")
    args = ap.parse_args()
    kinds = args.faults.split(",")
    unknown = set(kinds) - {"kill", "pause", "cut", "move", "split"}
    if unknown:
        ap.error(f"unknown faults: {', '.join(sorted(unknown))}")
    rng = random.Random(args.seed)
    tmp = Path(tempfile.mkdtemp(prefix="zerofan-soak-"))
    proxy = Partitioner()
    fronts = {i: proxy.front(i) for i in (1, 2, 3)}
    ns = [Node(i, free_port(), free_port(), tmp / f"n{i}") for i in (1, 2, 3)]
    for n in ns:
        proxy.targets[n.node_id] = n.cluster_port
        n.http_port = free_port()
        n.extra = ["--cluster-advertise", f"127.0.0.1:{fronts[n.node_id]}",
                   "--http", f"127.0.0.1:{n.http_port}"]
    h = History()
    faults: Counter = Counter()
    timeline: list[tuple[float, str, int]] = []
    subs: list[Sub] = []
    pubs: list[Pub] = []
    wills: list[WillClient] = []
    watch: Sub | None = None
    started = time.monotonic()
    wall = datetime.datetime.now(datetime.timezone.utc).strftime("%H:%M:%S.%f")[:-3]
    try:
        ns[0].start()
        assert healthy(ns[:1], 30), "node 1 alone"
        for n in ns[1:]:
            n.start(join=ns[0])
        assert healthy(ns, 30), "3 members"
        subs = [Sub("s5a", 5, 0, ns, h), Sub("s3b", 311, 1, ns, h), Sub("s5c", 5, 2, ns, h)]
        pubs = [Pub(f"q{qos}n{i}", qos, i, ns, h, limit=int(args.seconds * 60))
                for i in range(3) for qos in (1, 2)]
        watch = Sub("w5", 5, 1, ns, h, "soak-will/#")
        wills = [WillClient(f"will{i}", i, ns) for i in range(3)]
        delayed = [WillClient(f"delayed{i}", i + 1, ns, delayed=True) for i in range(2)]
        wills += delayed
        jumper = random.Random(args.seed)
        for t in subs + pubs + wills + [watch]:
            t.start()
        end = started + args.seconds
        while time.monotonic() < end:
            time.sleep(rng.uniform(2, 5))  # traffic between faults
            if not healthy(ns, SETTLE):
                raise AssertionError(f"the cluster did not recover in {SETTLE} s")
            fault = rng.choice(kinds)
            node = rng.choice(ns)
            faults[fault] += 1
            timeline.append((time.monotonic() - started, fault, node.node_id))
            if fault == "kill":
                node.kill()
                time.sleep(rng.uniform(1, args.down_max))
                node.start()
            elif fault == "pause":
                node.broker.proc.send_signal(signal.SIGSTOP)
                time.sleep(rng.uniform(1, 5))
                node.broker.proc.send_signal(signal.SIGCONT)
            elif fault == "cut":
                proxy.cut(node.node_id)
                time.sleep(rng.uniform(2, args.cut_max))
                proxy.heal()
            elif fault == "split":
                other = ns[(ns.index(node) + 1) % len(ns)]
                timeline[-1] = (timeline[-1][0], f"split from node {other.node_id} of",
                                node.node_id)
                proxy.split(node.node_id, other.node_id)
                time.sleep(rng.uniform(2, args.cut_max))
                proxy.heal()
            else:
                rng.choice(subs).move()
                # A delayed will client moves too, by a takeover; drawn
                # apart so that a seed's faults stay what they were.
                jumper.choice(delayed).jump()
        if not healthy(ns, SETTLE):
            raise AssertionError(f"the cluster did not recover in {SETTLE} s")
        for p in pubs:
            p.stop.set()
        for p in pubs:
            p.join(30)
        # Every acknowledged message reaches every subscriber (bounded).
        deadline = time.monotonic() + SETTLE
        while time.monotonic() < deadline:
            if all(s.count(who, seqs) == len(seqs) for s in subs
                   for who, seqs in h.acked.items() if h.qos[who] >= 1):
                break
            time.sleep(0.2)
        for w in wills:
            w.stop.set()
        for w in wills:
            w.join(30)
        # The last wills: a failover's claim, or the lost node's hand-over
        # (10 s), then delivery to the watcher (bounded).
        want = wills_due(wills)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            with watch.lock:
                if want <= set(h.received["w5"]):
                    break
            time.sleep(0.2)
        for s in subs + [watch]:
            s.stop.set()
        for s in subs + [watch]:
            s.join(30)
        # A subscriber that could not connect at the end: does a fresh
        # client with its id get a CONNACK? (Tells a stuck client id from
        # a stuck client.)
        if any(s.refused for s in subs):
            for n in live(ns):
                figures = {m: metric(n.http_port, f"zerofan_{m}") for m in (
                    "cluster_replication_lag", "inflight_messages", "queued_messages",
                    "queued_bytes_online", "connections_parked", "connections")}
                print(f"  node {n.node_id} at the end: {figures}")
        for sub in subs:
            if sub.refused and sub.refused[-1][0] > (sub.served[-1][0] if sub.served else 0):
                for n in live(ns):
                    # Raw MQTT 5: what arrives at all, in order.
                    got: list[str] = []
                    r = None
                    try:
                        r = mqttraw.RawClient("127.0.0.1", n.mqtt_port, timeout=10)
                        r.send(mqttraw.connect(sub.name, 5, 60, False,
                                               {mqttraw.SESSION_EXPIRY: 3600}))
                        deadline = time.monotonic() + 10
                        while time.monotonic() < deadline and len(got) < 5:
                            got.append(r.recv(deadline - time.monotonic()).name)
                    except Exception as e:
                        got.append(repr(e)[:80])
                    finally:
                        if r is not None:
                            r.close()
                    print(f"  probe: a fresh {sub.name} at node {n.node_id}: {got}")
        found = problems(h, [s.name for s in subs], {p.who: p.conns for p in pubs})
        found += [e for t in subs + pubs + wills + [watch] for e in t.errors]
        will_found, wills_missing = will_problems(list(h.received["w5"]), wills)
        found += will_found
        moves = {name: sum(metric(n.http_port, f"zerofan_cluster_{name}_total")
                           for n in live(ns))
                 for name in ("moves_relayed", "moves_relayed_messages", "moves_timed_out",
                              "moves_relay_dropped", "moves_relayed_had", "fenced_takeovers",
                              "lease_expiries", "lost_handed", "acks_refused", "stranded_sent", "stranded_kept",
                              "stranded_queued", "stranded_resent",
                              "stranded_replaced", "stranded_unread", "copies_asked",
                              "copies_sent", "replica_batches_had")}
        acked = sum(len(v) for v in h.acked.values())
        print(f"soak: {time.monotonic() - started:.0f} s, seed {args.seed}; faults "
              f"{dict(sorted(faults.items()))}; acknowledged {acked} "
              f"(given up {sum(p.given_up for p in pubs)}); "
              f"delivered {({s.name: len(h.received[s.name]) for s in subs})}; "
              f"subscriber reconnects {sum(s.reconnects for s in subs)}; "
              f"descriptors open here {len(os.listdir('/proc/self/fd'))}; "
              f"since the last restarts {moves}; "
              f"wills: connections ended {sum(1 for w in wills for c in w.conns if c[1])}, "
              f"due {len(wills_due(wills))}, published {len(h.received['w5'])}, "
              f"takeovers {sum(w.jumps for w in wills)} (clean start "
              f"{sum(1 for w in wills for c in w.conns[1:] if w.delayed and c[4])} of "
              f"{sum(len(w.conns) - 1 for w in wills if w.delayed)} returns), "
              f"missing {len(wills_missing)}; "
              f"problems {len(found)}")
        if wills_missing:
            print(f"  wills missing: {', '.join(wills_missing[:20])}")
        for f in found[:20]:
            print(f"  {f}")
        for s in subs:
            # Where and when each copy of a message delivered twice came.
            at: dict[tuple[str, int], list[str]] = collections.defaultdict(list)
            for p, (t, node) in zip(h.received[s.name], s.arrivals):
                at[parse(p)].append(f"{t - started:.1f} s node {node}")
            twice = [(k, v) for k, v in at.items() if len(v) > 1 and h.qos.get(k[0]) == 2]
            if twice:
                print(f"  {s.name}: {len(twice)} QoS 2 messages more than once, e.g. "
                      + "; ".join(f"{k[0]}:{k[1]} at {', '.join(v)}" for k, v in twice[:3]))
        if found and args.hold:
            # Keep the cluster up for a look (bounded).
            print("  holding: " + ", ".join(
                f"node {n.node_id} mqtt {n.mqtt_port} http {n.http_port} dir {n.tmp}"
                for n in live(ns)), flush=True)
            time.sleep(args.hold)
        if found:
            print(f"  started at {wall} UTC (node logs: {tmp})")
            print("  faults: " + ", ".join(f"{t:.1f} s {f} node {n}" for t, f, n in timeline))
            for sub in subs:
                print(f"  {sub.name} served: " + ", ".join(
                    f"{t - started:.1f} s node {n}{'' if p else ' (clean)'}"
                    for t, n, p in sub.served))
                if sub.refused:
                    print(f"  {sub.name} refused: " + ", ".join(
                        f"{t - started:.1f} s node {n} {why}" for t, n, why in sub.refused[:30]))
                    for t, line in list(sub.trace)[-25:]:
                        print(f"    {t - started:.2f} s paho: {line[:150]}")
            sent = {p.who: p.sent_at for p in pubs}
            sent_to = {p.who: p.sent_to for p in pubs}
            for f in found[:20]:
                # When the first message named was sent, for the timeline.
                for who in sent:
                    if f"of {who} missing, first [" in f:
                        first = int(f.split("first [")[1].split(",")[0].rstrip("]"))
                        print(f"  {f.split(':')[0]} {who}:{first} sent at "
                              f"{sent[who][first] - started:.1f} s to node "
                              f"{sent_to[who].get(first)}")
        return 1 if found else 0
    finally:
        for t in subs + pubs + wills + ([watch] if watch else []):
            t.stop.set()
        proxy.close()
        for n in ns:
            if n.broker is not None:
                if n.broker.alive():
                    n.broker.proc.send_signal(signal.SIGCONT)
                n.broker.terminate()


if __name__ == "__main__":
    sys.exit(main())
