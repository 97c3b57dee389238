"""paho-mqtt 2.x wrapped so that tests wait for events, never sleep.

Every callback feeds a queue or a keyed result; every wait has a timeout.
"""

from __future__ import annotations

import itertools
import queue
import threading

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode
from paho.mqtt.subscribeoptions import SubscribeOptions

WAIT = 10.0  # generous: the machine is loaded
_ids = itertools.count()


def props(packet_type=PacketTypes.PUBLISH, **kw) -> Properties:
    """props(PacketTypes.CONNECT, SessionExpiryInterval=60, UserProperty=[("a", "b")])"""
    p = Properties(packet_type)
    for k, v in kw.items():
        setattr(p, k, v)
    return p


def rc_value(rc) -> int:
    if rc is None:
        return 0
    return rc.value if isinstance(rc, ReasonCode) else int(rc)


class PahoClient:
    def __init__(self, broker, client_id: str | None = None, version: int = 5,
                 clean: bool = True, keepalive: int = 60, connect_props: Properties | None = None,
                 will: dict | None = None, connect: bool = True, manual_ack: bool = False):
        self.broker = broker
        self.version = version
        if client_id is None:
            client_id = f"t{next(_ids)}-{threading.get_ident() % 10000}"
        self.client_id = client_id
        kw = dict(callback_api_version=mqtt.CallbackAPIVersion.VERSION2, client_id=client_id,
                  protocol=mqtt.MQTTv5 if version == 5 else mqtt.MQTTv311,
                  reconnect_on_failure=False, manual_ack=manual_ack)
        if version != 5:
            kw["clean_session"] = clean
        self.clean = clean
        self.keepalive = keepalive
        self.connect_props = connect_props
        self.c = mqtt.Client(**kw)
        self.messages: queue.Queue = queue.Queue()
        self.connacks: queue.Queue = queue.Queue()
        self.disconnects: queue.Queue = queue.Queue()
        self._cond = threading.Condition()
        self._subacks: dict = {}
        self._unsubacks: dict = {}
        self.c.on_connect = self._on_connect
        self.c.on_disconnect = self._on_disconnect
        self.c.on_message = self._on_message
        self.c.on_subscribe = self._on_subscribe
        self.c.on_unsubscribe = self._on_unsubscribe
        if will:
            self.c.will_set(will["topic"], will.get("payload", b""), will.get("qos", 0),
                            will.get("retain", False), will.get("props"))
        self._looping = False
        if connect:
            self.connect()

    # -- callbacks (network thread)
    def _on_connect(self, client, userdata, flags, rc, properties):
        self.connacks.put((flags.session_present, rc_value(rc), properties))

    def _on_disconnect(self, client, userdata, flags, rc, properties):
        self.disconnects.put((rc_value(rc), properties))

    def _on_message(self, client, userdata, msg):
        self.messages.put(msg)

    def _on_subscribe(self, client, userdata, mid, rcs, properties):
        with self._cond:
            self._subacks[mid] = [rc_value(r) for r in rcs]
            self._cond.notify_all()

    def _on_unsubscribe(self, client, userdata, mid, rcs, properties):
        with self._cond:
            self._unsubacks[mid] = [rc_value(r) for r in rcs] if rcs else []
            self._cond.notify_all()

    # -- operations
    def connect(self, expect_rc: int | None = 0):
        """Connect and wait for CONNACK; returns (session_present, rc, properties)."""
        kw = {}
        if self.version == 5:
            kw["clean_start"] = self.clean
            kw["properties"] = self.connect_props
        self.c.connect(self.broker.host, self.broker.port, self.keepalive, **kw)
        if not self._looping:
            self.c.loop_start()
            self._looping = True
        try:
            result = self.connacks.get(timeout=WAIT)
        except queue.Empty:
            raise AssertionError(f"{self.client_id}: no CONNACK within {WAIT}s") from None
        if expect_rc is not None:
            assert result[1] == expect_rc, f"{self.client_id}: CONNACK reason {result[1]:#x}"
        self.connack = result
        return result

    @property
    def session_present(self) -> bool:
        return bool(self.connack[0])

    def _wait_key(self, table: dict, mid: int, what: str):
        with self._cond:
            if not self._cond.wait_for(lambda: mid in table, WAIT):
                raise AssertionError(f"{self.client_id}: no {what} for mid {mid} within {WAIT}s")
            return table.pop(mid)

    def subscribe(self, topic, qos: int = 0, options: SubscribeOptions | None = None,
                  properties: Properties | None = None, sub_id: int | None = None) -> list[int]:
        """Subscribe and wait for SUBACK; returns the reason codes."""
        if sub_id is not None:
            properties = props(PacketTypes.SUBSCRIBE, SubscriptionIdentifier=sub_id)
        if options is not None:
            rc, mid = self.c.subscribe(topic, options=options, properties=properties)
        elif self.version == 5:
            rc, mid = self.c.subscribe(topic, qos, properties=properties)
        else:
            rc, mid = self.c.subscribe(topic, qos)
        assert rc == mqtt.MQTT_ERR_SUCCESS, rc
        return self._wait_key(self._subacks, mid, "SUBACK")

    def unsubscribe(self, topic) -> list[int]:
        rc, mid = self.c.unsubscribe(topic)
        assert rc == mqtt.MQTT_ERR_SUCCESS, rc
        return self._wait_key(self._unsubacks, mid, "UNSUBACK")

    def publish(self, topic: str, payload=b"", qos: int = 0, retain: bool = False,
                properties: Properties | None = None, wait: bool = True):
        """Publish; with wait, block until the QoS flow with the broker is complete."""
        info = self.c.publish(topic, payload, qos, retain, properties)
        if wait:
            info.wait_for_publish(WAIT)
            assert info.is_published(), f"{self.client_id}: publish to {topic} not completed"
        return info

    def expect_message(self, timeout: float = WAIT) -> mqtt.MQTTMessage:
        try:
            return self.messages.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"{self.client_id}: no message within {timeout}s") from None

    def expect_messages(self, n: int, timeout: float = WAIT) -> list[mqtt.MQTTMessage]:
        return [self.expect_message(timeout) for _ in range(n)]

    def assert_no_message(self, duration: float = 0.5):
        """Nothing arrives within `duration` (a bounded wait to prove an absence)."""
        try:
            m = self.messages.get(timeout=duration)
        except queue.Empty:
            return
        raise AssertionError(f"{self.client_id}: unexpected message {m.topic} {m.payload!r}")

    def expect_disconnect(self, timeout: float = WAIT) -> tuple[int, Properties | None]:
        try:
            return self.disconnects.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"{self.client_id}: still connected after {timeout}s") from None

    def disconnect(self, reason: int | None = None, properties: Properties | None = None):
        """Normal DISCONNECT, waiting until paho reports the connection down."""
        rc = ReasonCode(PacketTypes.DISCONNECT, identifier=reason) if reason is not None else None
        self.c.disconnect(reasoncode=rc, properties=properties)
        self.expect_disconnect()
        self.c.loop_stop()
        self._looping = False

    def close(self):
        try:
            self.c.disconnect()
        except Exception:
            pass
        if self._looping:
            self.c.loop_stop()
            self._looping = False


def sub_opts(qos: int = 0, no_local: bool = False, rap: bool = False,
             retain_handling: int = 0) -> SubscribeOptions:
    return SubscribeOptions(qos=qos, noLocal=no_local, retainAsPublished=rap,
                            retainHandling=retain_handling)
