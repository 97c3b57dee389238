"""A cluster of real zerofan processes on loopback (issue 16): nodes join,
route each other's messages, keep retained messages everywhere, survive the
loss of a node and let it rejoin from its data dir.

What the clients saw is judged by `cluster_check.History` (every
acknowledged message delivered, per-publisher order, nothing invented).
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from cluster_check import History, payload
from conftest import Broker, free_port, launch_zerofan, zerofan_bin
from pahoclient import PahoClient
from pahoclient import props
from paho.mqtt.packettypes import PacketTypes

pytestmark = pytest.mark.zerofan_only

WAIT = 20.0


@dataclass
class Node:
    node_id: int
    cluster_port: int
    mqtt_port: int
    tmp: Path
    broker: Broker | None = None

    @property
    def cluster_addr(self) -> str:
        return f"127.0.0.1:{self.cluster_port}"

    def start(self, join: "Node | None" = None) -> "Node":
        self.tmp.mkdir(parents=True, exist_ok=True)
        args = ["--node-id", str(self.node_id), "--cluster-listen", self.cluster_addr,
                "--listen", f"127.0.0.1:{self.mqtt_port}", "--data-dir", str(self.tmp / "data")]
        if join is not None:
            args += ["--join", join.cluster_addr]
        self.broker = launch_zerofan(self.tmp, args)
        return self

    def kill(self):
        assert self.broker is not None
        self.broker.proc.send_signal(signal.SIGKILL)
        self.broker.proc.wait()
        self.broker.returncode = 0  # killed on purpose: teardown must not fail


def cluster_cli(*args: str, timeout: float = 10) -> subprocess.CompletedProcess:
    return subprocess.run([str(zerofan_bin()), "cluster", *args], capture_output=True,
                          text=True, timeout=timeout)


def status(node: Node) -> dict | None:
    r = cluster_cli("status", "--connect", node.cluster_addr, "--json")
    if r.returncode != 0:
        return None
    return json.loads(r.stdout)


def wait_status(node: Node, ok, what: str, timeout: float = WAIT) -> dict:
    """Poll `cluster status --json` (no event to wait on across processes)
    until `ok(status)`."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = status(node)
        if last is not None and ok(last):
            return last
        time.sleep(0.1)
    pytest.fail(f"{what}: last status {last}")


def voters_with_leader(n: int):
    def ok(s: dict) -> bool:
        members = s.get("members", [])
        leaders = [m for m in members if m.get("role") == "leader"]
        return len(members) == n and len(leaders) == 1 and all(m.get("healthy") for m in members)
    return ok


@pytest.fixture
def nodes(tmp_path):
    made: list[Node] = []

    def make(n: int) -> list[Node]:
        for i in range(1, n + 1):
            made.append(Node(i, free_port(), free_port(), tmp_path / f"n{i}"))
        made[0].start()
        wait_status(made[0], voters_with_leader(1), "node 1 alone")
        for node in made[1:]:
            node.start(join=made[0])
        wait_status(made[0], voters_with_leader(n), f"{n} members")
        return made

    yield make
    errors = []
    for node in made:
        if node.broker is not None and node.broker.terminate() != 0:
            errors.append(f"node {node.node_id} exited {node.broker.returncode}\n"
                          f"{node.broker.log()}")
    assert not errors, "\n".join(errors)


@pytest.fixture
def clients():
    made: list[PahoClient] = []

    def make(node: Node, **kw) -> PahoClient:
        c = PahoClient(node.broker, **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def drain(c: PahoClient, n: int, h: History, name: str, timeout: float = WAIT):
    for _ in range(n):
        h.received[name].append(c.expect_message(timeout).payload)


def test_checker_finds_each_broken_promise():
    """The checker itself: each promise broken once, each found."""
    h = History()
    h.qos.update({"p": 1, "q": 2})
    h.acked["p"].update({0, 1, 2})
    h.acked["q"].update({0})
    h.received["ok"] = [payload("p", 0), payload("p", 1), payload("p", 2), payload("q", 0)]
    assert h.problems(["ok"]) == []
    h.received["lost"] = [payload("p", 0), payload("q", 0)]
    h.received["order"] = [payload("p", 1), payload("p", 0), payload("p", 2), payload("q", 0)]
    h.received["twice"] = [payload("p", 0), payload("p", 1), payload("p", 2),
                           payload("q", 0), payload("q", 0)]
    h.received["ghost"] = [payload("x", 0)]
    found = "\n".join(h.problems(["lost", "order", "twice", "ghost"]))
    assert "lost: 2 acknowledged messages of p missing" in found
    assert "order: p:0 after p:1" in found
    assert "twice: QoS 2 messages of q twice" in found
    assert "ghost: x:0 was never published" in found
    h.received["m1"] = [payload("p", 0), payload("p", 1)]
    h.received["m2"] = [payload("p", 1), payload("q", 0)]
    found = "\n".join(h.shared_problems(["m1", "m2"]))
    assert "messages of p reached no member" in found
    assert "messages of p reached two members" in found


def test_status_lists_every_member(nodes):
    ns = nodes(3)
    s = status(ns[2])
    assert sorted(m["node_id"] for m in s["members"]) == [1, 2, 3]
    r = cluster_cli("status", "--connect", ns[0].cluster_addr)
    assert r.returncode == 0 and "leader" in r.stdout, r.stdout + r.stderr
    r = cluster_cli("status", "--connect", f"127.0.0.1:{free_port()}")
    assert r.returncode != 0 and r.stderr.strip(), "a dead address must say so"


def test_publish_on_any_node_reaches_every_node(nodes, clients):
    ns = nodes(3)
    h = History()
    subs = {}
    for node in ns:
        c = clients(node)
        assert c.subscribe("c/#", 1) == [1]
        subs[f"sub{node.node_id}"] = c
    # The SUBACK waits until every node routes the filter: no settling time.
    pubs = {"p1": clients(ns[0]), "p2": clients(ns[1])}
    n = 150
    for name, p in pubs.items():
        h.qos[name] = 1
        for i in range(n):
            p.publish(f"c/{name}", payload(name, i), qos=1, wait=False)
    for name, p in pubs.items():
        p.publish(f"c/{name}", payload(name, n), qos=1)  # waits for its PUBACK
        h.acked[name].update(range(n + 1))
    for name, c in subs.items():
        drain(c, 2 * (n + 1), h, name)
        c.assert_no_message(0.3)
    assert h.problems() == []
    # QoS 0 crosses too.
    q = clients(ns[2])
    q.publish("c/q0", b"q0:0", qos=0)
    for c in subs.values():
        assert c.expect_message().payload == b"q0:0"


def test_shared_group_spans_nodes(nodes, clients):
    ns = nodes(3)
    members = {}
    for node in ns:
        c = clients(node)
        assert c.subscribe("$share/g/s/#", 1) == [1]
        members[f"m{node.node_id}"] = c
    h = History()
    h.qos["p"] = 1
    p = clients(ns[0])
    n = 120
    for i in range(n):
        p.publish("s/x", payload("p", i), qos=1, wait=False)
    p.publish("s/x", payload("p", n), qos=1)
    h.acked["p"].update(range(n + 1))
    deadline = time.monotonic() + WAIT
    total = 0
    while total < n + 1 and time.monotonic() < deadline:
        for name, c in members.items():
            try:
                m = c.messages.get(timeout=0.05)
            except Exception:
                continue
            h.received[name].append(m.payload)
            total += 1
    for c in members.values():
        c.assert_no_message(0.3)
    assert h.shared_problems(list(members)) == []
    assert sum(1 for name in members if h.received[name]) >= 2, \
        "the group's members on other nodes got none"


def test_retained_is_seen_from_every_node(nodes, clients):
    ns = nodes(3)
    clients(ns[1]).publish("r/kept", b"v1", qos=1, retain=True)
    for node in ns:
        late = clients(node)
        late.subscribe("r/#", 1)
        m = late.expect_message()
        assert (m.payload, m.retain) == (b"v1", 1), node.node_id
    # A newer value from another node replaces it everywhere.
    clients(ns[2]).publish("r/kept", b"v2", qos=1, retain=True)
    for node in ns:
        late = clients(node)
        late.subscribe("r/#", 1)
        assert late.expect_message().payload == b"v2", node.node_id


def test_losing_a_node_and_rejoining(nodes, clients):
    ns = nodes(3)
    on3 = clients(ns[2])
    on3.subscribe("k/#", 1)
    ns[2].kill()
    on3.close()
    # The others go on: a new subscription is acknowledged although node 3
    # cannot see it, and messages flow between nodes 1 and 2.
    on2 = clients(ns[1])
    assert on2.subscribe("k/#", 1) == [1]
    p = clients(ns[0])
    for i in range(20):
        p.publish("k/x", payload("p", i), qos=1)
    h = History()
    h.qos["p"] = 1
    h.acked["p"].update(range(20))
    drain(on2, 20, h, "on2")
    assert h.problems(["on2"]) == []
    s = wait_status(ns[0], lambda s: any(m["node_id"] == 3 and not m["healthy"]
                                         for m in s["members"]), "node 3 unhealthy")
    assert len(s["members"]) == 3
    # Node 3 comes back from its data dir, without --join.
    ns[2].start()
    wait_status(ns[0], voters_with_leader(3), "node 3 back")
    back = clients(ns[2])
    assert back.subscribe("k/#", 1) == [1]
    p.publish("k/x", b"p:100", qos=1)
    assert back.expect_message().payload == b"p:100"
    assert on2.expect_message().payload == b"p:100"


def test_leader_killed_a_new_one_is_elected(nodes):
    ns = nodes(3)
    s = status(ns[0])
    leader = next(m["node_id"] for m in s["members"] if m["role"] == "leader")
    ns[leader - 1].kill()
    rest = [n for n in ns if n.node_id != leader]
    t0 = time.monotonic()
    s = wait_status(rest[0], lambda s: any(m["role"] == "leader" and m["node_id"] != leader
                                           for m in s["members"]), "a new leader", 10)
    assert time.monotonic() - t0 < 10
    assert len(s["members"]) == 3


def test_a_client_id_moves_between_nodes(nodes, clients):
    """Connecting to node 2 with a client id connected to node 1 takes it
    over: node 1's connection gets DISCONNECT 0x8E (the claim went through
    the cluster's log), for several ids and both ways."""
    ns = nodes(3)
    for i in range(4):
        cid = f"dev-{i}"
        first = clients(ns[i % 3], client_id=cid)
        second = clients(ns[(i + 1) % 3], client_id=cid)
        rc, _ = first.expect_disconnect()
        assert rc == 0x8E, (cid, rc)
        # The new owner serves it.
        assert second.subscribe(f"own/{cid}", 1) == [1]
        clients(ns[2]).publish(f"own/{cid}", b"x", qos=1)
        assert second.expect_message().payload == b"x"


def test_without_a_majority_a_client_id_is_refused(nodes, clients):
    """Two of three nodes gone: the survivor cannot claim a client id, so a
    CONNECT gets 0x88 (Server unavailable) instead of a second owner."""
    ns = nodes(3)
    ns[1].kill()
    ns[2].kill()
    c = PahoClient(ns[0].broker, client_id="lonely", connect=False)
    try:
        _, rc, _ = c.connect(expect_rc=None)
        assert rc == 0x88, rc
    finally:
        c.close()


def test_a_paused_leader_is_replaced_and_does_not_act_on_stale_ownership(nodes, clients):
    """SIGSTOP the leader: the others elect a new one and go on claiming
    client ids. When the old leader wakes, it is a follower: a client id
    it served earlier, taken over meanwhile elsewhere, is not served there
    any more (its connection gets 0x8E once it hears of the newer claim),
    and a new claim made through it goes through the new leader."""
    ns = nodes(3)
    s = status(ns[0])
    leader = next(m["node_id"] for m in s["members"] if m["role"] == "leader")
    old = ns[leader - 1]
    rest = [n for n in ns if n is not old]
    on_old = clients(old, client_id="sensor")
    old.broker.proc.send_signal(signal.SIGSTOP)
    try:
        wait_status(rest[0], lambda s: any(m["role"] == "leader" and m["node_id"] != leader
                                           for m in s["members"]), "a new leader", 20)
        # The majority gives the id to another node while the old leader sleeps.
        moved = clients(rest[0], client_id="sensor")
        assert moved.subscribe("p/#", 1) == [1]
    finally:
        old.broker.proc.send_signal(signal.SIGCONT)
    # Awake, the old leader learns of the newer claim: its connection goes.
    rc, _ = on_old.expect_disconnect(timeout=20)
    assert rc == 0x8E, rc
    # Claims through it work again (it forwards to the new leader), and
    # take the id back from the other node.
    back = clients(old, client_id="sensor")
    rc, _ = moved.expect_disconnect(timeout=20)
    assert rc == 0x8E, rc
    assert back.subscribe("p/#", 1) == [1]


def _persistent(node: Node, cid: str, version: int) -> PahoClient:
    if version == 5:
        return PahoClient(node.broker, client_id=cid, clean=False,
                          connect_props=props(PacketTypes.CONNECT, SessionExpiryInterval=3600))
    return PahoClient(node.broker, client_id=cid, version=311, clean=False)


def test_killing_the_owner_of_persistent_sessions_loses_nothing(nodes, clients):
    """A persistent MQTT 5 subscriber and a 3.1.1 clean-session-0 one live
    on node 1 and go offline; node 2 publishes N QoS 1 and N QoS 2
    messages, all acknowledged (each only once the replicas have it);
    node 1 is killed (-9); both reconnect to node 3 and find their session
    there with every acknowledged message, QoS 2 ones exactly once."""
    ns = nodes(3)
    subs = {"s5": 5, "s3": 311}
    for name, version in subs.items():
        c = _persistent(ns[0], name, version)
        assert c.subscribe("p/#", 2) == [2]
        c.disconnect()
    p = clients(ns[1])
    h = History()
    n = 100
    h.qos.update({"q1": 1, "q2": 2})
    sent = []
    for i in range(n):
        sent.append(("q1", i, p.publish("p/1", payload("q1", i), qos=1, wait=False)))
        sent.append(("q2", i, p.publish("p/2", payload("q2", i), qos=2, wait=False)))
    for who, i, info in sent:
        info.wait_for_publish(WAIT)
        assert info.is_published(), (who, i)
        h.acked[who].add(i)
    killed = time.monotonic()
    ns[0].kill()
    served = None
    for name, version in subs.items():
        c = _persistent(ns[2], name, version)
        if served is None:
            served = time.monotonic() - killed
        assert c.session_present, f"{name}: session not present on node 3"
        drain(c, 2 * n, h, name)
        c.assert_no_message(0.3)
        c.close()
    assert h.problems(list(subs)) == []
    print(f"failover: session served on node 3 {served:.2f} s after kill -9 of its owner")
    assert served < 5.0


def test_a_takeover_with_the_old_owner_alive_moves_the_session(nodes, clients):
    """The same client id connecting to node 2 while node 1, its owner, is
    alive: node 1's connection gets 0x8E and node 2 serves the session with
    what was queued for it on node 1 (node 2 held its copy)."""
    ns = nodes(3)
    first = _persistent(ns[0], "mover", 5)
    assert first.subscribe("mv/#", 1) == [1]
    first.disconnect()
    p = clients(ns[2])
    h = History()
    h.qos["p"] = 1
    for i in range(50):
        p.publish("mv/x", payload("p", i), qos=1)
        h.acked["p"].add(i)
    moved = _persistent(ns[1], "mover", 5)
    assert moved.session_present
    drain(moved, 50, h, "mover")
    moved.assert_no_message(0.3)
    moved.close()
    assert h.problems(["mover"]) == []
