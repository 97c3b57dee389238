// MQTT.js and paho-mqtt (Python) talking to each other through the broker.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { createInterface } from 'node:readline';
import { startBroker, connect, nextMessage, itest, withTimeout, WAIT } from './broker.mjs';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const PYTHON = path.resolve(HERE, '..', '..', '..', '.venv', 'bin', 'python');
const PEER = path.join(HERE, 'paho_peer.py');
const T = (name, fn) => itest(import.meta.url, name, fn);

function paho(broker, ...args) {
  const proc = spawn(PYTHON, [PEER, broker.host, String(broker.port), ...args],
    { stdio: ['ignore', 'pipe', 'inherit'] });
  const lines = createInterface({ input: proc.stdout });
  const queue = [];
  const waiters = [];
  lines.on('line', (l) => { const w = waiters.shift(); if (w) w(l); else queue.push(l); });
  const exit = new Promise((resolve) => proc.once('exit', (code) => resolve(code)));
  return {
    proc,
    exit: () => withTimeout(exit, WAIT * 2, 'paho peer exit'),
    line: () => (queue.length ? Promise.resolve(queue.shift())
      : withTimeout(new Promise((resolve) => waiters.push(resolve)), WAIT * 2, 'paho peer line')),
  };
}

async function setup(t) {
  if (!existsSync(PYTHON)) throw new Error(`${PYTHON} missing: run scripts/test.sh once`);
  const broker = await startBroker();
  const clients = [];
  t.after(async () => {
    for (const c of clients) c.end(true);
    await broker.stop();
  });
  return { broker, client: async (o) => { const c = await connect(broker, o); clients.push(c); return c; } };
}

T('MQTT.js publishes, paho subscribes', async (t) => {
  const { broker, client } = await setup(t);
  const sub = paho(broker, 'sub', 'x/js2py', '2');
  assert.equal(await sub.line(), 'READY');
  const pub = await client({ protocolVersion: 5 });
  await pub.publishAsync('x/js2py', 'one', {
    qos: 1, properties: { contentType: 'text/plain', userProperties: { from: 'mqtt.js' } },
  });
  await pub.publishAsync('x/js2py', 'two', { qos: 2 });
  const a = JSON.parse(await sub.line());
  const b = JSON.parse(await sub.line());
  assert.deepEqual([a.payload, a.qos, a.contentType], ['one', 1, 'text/plain']);
  assert.deepEqual(a.userProperties, [['from', 'mqtt.js']]);
  assert.deepEqual([b.payload, b.qos], ['two', 2]);
  assert.equal(await sub.exit(), 0);
});

T('paho publishes, MQTT.js subscribes', async (t) => {
  const { broker, client } = await setup(t);
  const sub = await client({ protocolVersion: 5 });
  await sub.subscribeAsync('x/py2js', { qos: 2 });
  const pub = paho(broker, 'pub', 'x/py2js', 'hello from paho');
  const m = await nextMessage(sub);
  assert.equal(m.payload.toString(), 'hello from paho');
  assert.equal(m.packet.qos, 2);
  assert.equal(m.packet.properties.contentType, 'text/plain');
  assert.deepEqual({ ...m.packet.properties.userProperties }, { from: 'paho' });
  assert.equal(await pub.exit(), 0);
});
