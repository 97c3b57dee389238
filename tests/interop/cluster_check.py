"""A checker in the style of Jepsen for cluster runs: it reads what the
clients saw (what each publisher had acknowledged, what each subscriber
received) and says which promise was broken.

Messages carry `publisher:seq` payloads, so a subscriber's history alone
tells which message it got and in which order.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field


def payload(publisher: str, seq: int) -> bytes:
    return f"{publisher}:{seq}".encode()


def parse(p: bytes) -> tuple[str, int]:
    who, seq = p.decode().rsplit(":", 1)
    return who, int(seq)


@dataclass
class History:
    """What the clients of one run saw."""

    # publisher -> QoS and the sequence numbers the broker acknowledged
    # (for QoS 0: every one sent).
    acked: dict[str, set[int]] = field(default_factory=lambda: defaultdict(set))
    qos: dict[str, int] = field(default_factory=dict)
    # subscriber -> payloads in arrival order
    received: dict[str, list[bytes]] = field(default_factory=lambda: defaultdict(list))
    # client id -> (node, start, end) for each connection that was served:
    # from its CONNACK to when it saw the connection end (None: still on).
    owners: dict[str, list[tuple[int, float, float | None]]] = field(
        default_factory=lambda: defaultdict(list))

    def owner_problems(self) -> list[str]:
        """At most one owner per client id at any time: no two served
        intervals of one client id on different nodes overlap. The client's
        view makes each interval at least as long as the server's, so an
        overlap found here is a real one or a close call."""
        out = []
        for cid, spans in self.owners.items():
            spans = sorted(spans, key=lambda s: s[1])
            for i, (node, start, end) in enumerate(spans):
                for other, start2, end2 in spans[i + 1:]:
                    if other != node and (end is None or start2 < end):
                        out.append(f"{cid}: node {node} served until "
                                   f"{'the end' if end is None else f'{end:.3f}'}, "
                                   f"node {other} from {start2:.3f}")
        return out

    def problems(self, subscribers: list[str] | None = None) -> list[str]:
        """Every broken promise: an acknowledged QoS 1/2 message missing at a
        subscriber, a QoS 2 message twice, a publisher's messages out of
        order, a message nobody published."""
        out = []
        subs = subscribers if subscribers is not None else list(self.received)
        for sub in subs:
            got = [parse(p) for p in self.received.get(sub, [])]
            counts = Counter(got)
            last: dict[str, int] = {}
            for who, seq in got:
                if who not in self.qos:
                    out.append(f"{sub}: {who}:{seq} was never published")
                    continue
                if seq < last.get(who, -1):
                    out.append(f"{sub}: {who}:{seq} after {who}:{last[who]} (order)")
                last[who] = max(seq, last.get(who, -1))
            for who, seqs in self.acked.items():
                q = self.qos.get(who, 0)
                if q >= 1:
                    missing = sorted(s for s in seqs if counts[(who, s)] == 0)
                    if missing:
                        out.append(f"{sub}: {len(missing)} acknowledged messages of {who} "
                                   f"missing, first {missing[:5]}")
                if q == 2:
                    twice = sorted(s for s in seqs if counts[(who, s)] > 1)
                    if twice:
                        out.append(f"{sub}: QoS 2 messages of {who} twice: {twice[:5]}")
        return out

    def shared_problems(self, members: list[str]) -> list[str]:
        """For a shared group: each acknowledged message reached exactly one
        member (QoS 1 may repeat only after a member left; not here)."""
        seen: Counter = Counter()
        for m in members:
            seen.update(parse(p) for p in self.received.get(m, []))
        out = []
        for who, seqs in self.acked.items():
            lost = sorted(s for s in seqs if seen[(who, s)] == 0)
            dup = sorted(s for s in seqs if seen[(who, s)] > 1)
            if lost:
                out.append(f"group: {len(lost)} messages of {who} reached no member, "
                           f"first {lost[:5]}")
            if dup:
                out.append(f"group: {len(dup)} messages of {who} reached two members, "
                           f"first {dup[:5]}")
        return out

