"""paho-mqtt peer for the MQTT.js interop tests (run with the repo's .venv python).

  paho_peer.py HOST PORT sub TOPIC N   subscribe (v5, QoS 2), print READY, then one
                                       JSON line per message; exit after N
  paho_peer.py HOST PORT pub TOPIC PAYLOAD
                                       publish once at QoS 2 with v5 properties
"""

import json
import sys
import threading

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties


def main():
    host, port, mode, topic = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    done = threading.Event()
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    if mode == "sub":
        want, got = int(sys.argv[5]), []

        def on_connect(client, userdata, flags, rc, props):
            client.subscribe(topic, 2)

        def on_subscribe(client, userdata, mid, rcs, props):
            print("READY", flush=True)

        def on_message(client, userdata, m):
            p = m.properties
            print(json.dumps({
                "topic": m.topic, "payload": m.payload.decode(), "qos": m.qos,
                "contentType": getattr(p, "ContentType", None),
                "userProperties": getattr(p, "UserProperty", []),
            }), flush=True)
            got.append(m)
            if len(got) >= want:
                done.set()

        c.on_connect, c.on_subscribe, c.on_message = on_connect, on_subscribe, on_message
    else:
        def on_connect(client, userdata, flags, rc, props):
            p = Properties(PacketTypes.PUBLISH)
            p.ContentType = "text/plain"
            p.UserProperty = [("from", "paho")]
            client.publish(topic, sys.argv[5], 2, properties=p)

        c.on_connect = on_connect
        c.on_publish = lambda client, userdata, mid, rc, props: done.set()
    c.connect(host, port)
    c.loop_start()
    ok = done.wait(20)
    c.disconnect()
    c.loop_stop()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
