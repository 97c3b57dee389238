// MQTT.js against the broker: connect (v4, v5), QoS 0/1/2, retained, will.
import assert from 'node:assert/strict';
import {
  BROKER, startBroker, connect, nextMessage, itest, withTimeout, WAIT,
} from './broker.mjs';

const T = (name, fn) => itest(import.meta.url, name, fn);

async function withBroker(t, settings = {}) {
  const broker = await startBroker(settings);
  const clients = [];
  t.after(async () => {
    for (const c of clients) c.end(true);
    await broker.stop();
  });
  return {
    broker,
    async client(opts) {
      const c = await connect(broker, opts);
      clients.push(c);
      return c;
    },
  };
}

for (const protocolVersion of [4, 5]) {
  T(`connect v${protocolVersion}`, async (t) => {
    const { client } = await withBroker(t);
    const c = await client({ protocolVersion, clientId: `js-conn-${protocolVersion}` });
    assert.equal(c.connected, true);
    await c.endAsync();
  });

  for (const qos of [0, 1, 2]) {
    T(`publish and subscribe v${protocolVersion} qos ${qos}`, async (t) => {
      const { client } = await withBroker(t);
      const sub = await client({ protocolVersion });
      const granted = await sub.subscribeAsync('js/qos/#', { qos: 2 });
      assert.equal(granted[0].qos, 2);
      const pub = await client({ protocolVersion });
      for (let i = 0; i < 3; i++) {
        await pub.publishAsync(`js/qos/${qos}`, `m${i}`, { qos });
      }
      for (let i = 0; i < 3; i++) {
        const m = await nextMessage(sub);
        assert.equal(m.topic, `js/qos/${qos}`);
        assert.equal(m.payload.toString(), `m${i}`);
        assert.equal(m.packet.qos, qos);
      }
    });
  }

  T(`retained v${protocolVersion}`, async (t) => {
    const { client } = await withBroker(t);
    const pub = await client({ protocolVersion });
    await pub.publishAsync('js/ret', 'first', { qos: 1, retain: true });
    await pub.publishAsync('js/ret', 'second', { qos: 1, retain: true });
    const sub = await client({ protocolVersion });
    await sub.subscribeAsync('js/ret', { qos: 1 });
    const m = await nextMessage(sub);
    assert.equal(m.payload.toString(), 'second');
    assert.equal(m.packet.retain, true);
    // clear it: a new subscriber gets nothing, a live one still gets the (empty) publish
    await pub.publishAsync('js/ret', '', { qos: 1, retain: true });
    const live = await nextMessage(sub);
    assert.equal(live.payload.length, 0);
    const late = await client({ protocolVersion });
    await late.subscribeAsync('js/ret', { qos: 1 });
    await late.subscribeAsync('js/marker', { qos: 1 });
    await pub.publishAsync('js/marker', 'after', { qos: 1 });
    const first = await nextMessage(late);
    assert.equal(first.topic, 'js/marker', 'a cleared retained message was delivered');
  });

  T(`will on abrupt close v${protocolVersion}`, async (t) => {
    const { client } = await withBroker(t);
    const watcher = await client({ protocolVersion });
    await watcher.subscribeAsync('js/will/#', { qos: 1 });
    const dying = await client({
      protocolVersion,
      clientId: `js-dying-${protocolVersion}`,
      will: { topic: 'js/will/gone', payload: Buffer.from('bye'), qos: 1, retain: false },
    });
    dying.stream.destroy(); // no DISCONNECT
    const m = await nextMessage(watcher);
    assert.equal(m.topic, 'js/will/gone');
    assert.equal(m.payload.toString(), 'bye');
  });

  T(`no will on normal disconnect v${protocolVersion}`, async (t) => {
    const { client } = await withBroker(t);
    const watcher = await client({ protocolVersion });
    await watcher.subscribeAsync('js/will2/#', { qos: 1 });
    const polite = await client({
      protocolVersion,
      will: { topic: 'js/will2/gone', payload: Buffer.from('bye'), qos: 1, retain: false },
    });
    await polite.endAsync();
    const other = await client({ protocolVersion });
    await other.publishAsync('js/will2/marker', 'marker', { qos: 1 });
    const m = await nextMessage(watcher);
    assert.equal(m.topic, 'js/will2/marker', 'will published on a normal DISCONNECT');
  });
}

T('v5 properties pass through', async (t) => {
  const { client } = await withBroker(t);
  const sub = await client({ protocolVersion: 5 });
  await sub.subscribeAsync('js/props', { qos: 1 });
  const pub = await client({ protocolVersion: 5 });
  await pub.publishAsync('js/props', '{"a":1}', {
    qos: 1,
    properties: {
      payloadFormatIndicator: true,
      contentType: 'application/json',
      responseTopic: 'js/reply',
      correlationData: Buffer.from([1, 2, 3]),
      userProperties: { k: 'v', multi: ['x', 'y'] },
    },
  });
  const m = await nextMessage(sub);
  const p = m.packet.properties;
  assert.equal(p.contentType, 'application/json');
  assert.equal(p.responseTopic, 'js/reply');
  assert.deepEqual([...p.correlationData], [1, 2, 3]);
  assert.equal(p.payloadFormatIndicator, true);
  assert.deepEqual({ ...p.userProperties }, { k: 'v', multi: ['x', 'y'] });
});

T('sigterm: broker exits 0 with v5 clients connected', async (t) => {
  const { broker, client } = await withBroker(t);
  const c = await client({ protocolVersion: 5 });
  const disconnected = new Promise((resolve) => c.once('disconnect', resolve));
  const closed = new Promise((resolve) => c.once('close', resolve));
  await broker.stop();
  await withTimeout(closed, WAIT, 'connection closed after SIGTERM');
  const packet = await withTimeout(disconnected, 1000, 'DISCONNECT').catch(() => null);
  if (BROKER === 'zerofan') { // mosquitto 2.0 closes without a DISCONNECT
    assert.ok(packet, 'no DISCONNECT from the broker on shutdown');
    assert.equal(packet.reasonCode, 0x8b);
  }
});
