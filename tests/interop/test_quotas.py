"""Quotas on state clients grow, seen by paho-mqtt: max_subscriptions_per_session
(SUBACK 0x97, 3.1.1: 0x80), max_retained_messages (not kept, still delivered;
PUBACK 0x97 for MQTT 5), each with its zerofan_limit_refused_total counter."""

from __future__ import annotations

import threading

import pytest

from pahoclient import sub_opts
from test_operability import scrape, start, val

pytestmark = pytest.mark.zerofan_only

WAIT = 10.0
REFUSED = "zerofan_limit_refused_total"


def test_subscription_and_retained_quotas(broker_factory, client_factory):
    b, base = start(broker_factory, max_subscriptions_per_session=2, max_retained_messages=1)

    v5 = client_factory(b, version=5)
    assert v5.subscribe("q/a", 1) == [1]
    assert v5.subscribe("q/b", 1) == [1]
    assert v5.subscribe("q/c", 1) == [0x97]
    # Subscribing again to a filter it holds replaces it, within the quota.
    assert v5.subscribe("q/a", 0) == [0]
    v3 = client_factory(b, version=4)
    assert v3.subscribe("q/a", 0) == [0]
    assert v3.subscribe("q/b", 0) == [0]
    assert v3.subscribe("q/c", 0) == [0x80]

    sub = client_factory(b, version=5)
    assert sub.subscribe("r/#", 1) == [1]
    publisher = client_factory(b, version=5)
    acks: dict = {}
    done = threading.Condition()

    def on_publish(client, userdata, mid, reason_code, properties):
        with done:
            acks[mid] = reason_code.value
            done.notify_all()

    publisher.c.on_publish = on_publish

    def publish_retained(topic):
        info = publisher.publish(topic, b"kept?", qos=1, retain=True)
        with done:
            assert done.wait_for(lambda: info.mid in acks, WAIT), f"no PUBACK for {topic}"
            return acks[info.mid]

    assert publish_retained("r/1") == 0
    assert publish_retained("r/2") == 0x97
    # Both went to the live subscriber.
    assert sorted(m.topic for m in sub.expect_messages(2)) == ["r/1", "r/2"]
    # Only the first is kept for a later subscriber.
    late = client_factory(b, version=5)
    assert late.subscribe("r/#", options=sub_opts(1)) == [1]
    assert [m.topic for m in late.expect_messages(1)] == ["r/1"]
    late.assert_no_message(0.3)

    m = scrape(base)
    assert val(m, REFUSED, limit="max_subscriptions_per_session") == 2
    assert val(m, REFUSED, limit="max_retained_messages") == 1
    assert val(m, REFUSED, limit="max_retained_bytes") == 0
