// Starts the broker for the MQTT.js interop tests, the same way conftest.py
// does: `zerofan --listen 127.0.0.1:0 --memory --config <tmp>.toml`, waiting
// for its "zerofan listening on HOST:PORT" line; or, with BROKER=mosquitto,
// Debian's mosquitto on a free port. Stopping sends SIGTERM and expects exit 0.
import { spawn } from 'node:child_process';
import {
  mkdtempSync, writeFileSync, readFileSync, existsSync, openSync, closeSync, rmSync,
} from 'node:fs';
import { createServer, connect as netConnect } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { once } from 'node:events';
import { test } from 'node:test';
import mqtt from 'mqtt';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const INTEROP = path.dirname(HERE);
const REPO = path.resolve(INTEROP, '..', '..');
export const BROKER = process.env.BROKER || 'zerofan';
export const WAIT = 10_000;
// ZEROFAN_THREADS=N: every zerofan here runs N shards unless a test names its
// own (default 1, said explicitly: the broker's own default is one per core).
export const THREADS = Number(process.env.ZEROFAN_THREADS || 1);

function zerofanBin() {
  if (process.env.ZEROFAN_BIN) return process.env.ZEROFAN_BIN;
  const target = path.resolve(REPO, process.env.CARGO_TARGET_DIR || 'target');
  return path.join(target, 'release', 'zerofan');
}

async function freePort() {
  const srv = createServer();
  srv.listen(0, '127.0.0.1');
  await once(srv, 'listening');
  const { port } = srv.address();
  srv.close();
  await once(srv, 'close');
  return port;
}

function withTimeout(promise, ms, what) {
  let timer;
  const t = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms: ${what}`)), ms);
  });
  return Promise.race([promise, t]).finally(() => clearTimeout(timer));
}
export { withTimeout };

async function portAccepts(port) {
  return new Promise((resolve) => {
    const s = netConnect(port, '127.0.0.1');
    s.once('connect', () => { s.destroy(); resolve(true); });
    s.once('error', () => resolve(false));
  });
}

export async function startBroker(settings = {}) {
  const dir = mkdtempSync(path.join(tmpdir(), 'zerofan-js-'));
  const conf = { sys_interval: 1, ...settings };
  let proc, host, port;
  if (BROKER === 'zerofan') {
    conf.threads ??= THREADS;
    const bin = zerofanBin();
    if (!existsSync(bin)) throw new Error(`broker binary ${bin} not found`);
    const file = path.join(dir, 'zerofan.toml');
    writeFileSync(file, Object.entries(conf)
      .map(([k, v]) => `${k} = ${typeof v === 'string' ? JSON.stringify(v) : v}\n`).join(''));
    const log = openSync(path.join(dir, 'zerofan.stderr.log'), 'w');
    proc = spawn(bin, ['--listen', '127.0.0.1:0', '--memory', '--config', file],
      { cwd: dir, stdio: ['ignore', 'pipe', log] });
    closeSync(log);
    const addr = await withTimeout(new Promise((resolve, reject) => {
      let buf = '';
      const onData = (chunk) => {
        buf += chunk.toString();
        const m = buf.match(/zerofan listening on (\S+)/);
        if (m) resolve(m[1]);
      };
      proc.stdout.on('data', onData);
      proc.once('exit', (code) => reject(new Error(`zerofan exited ${code} before listening`)));
    }), 20_000, 'zerofan listening line');
    proc.stdout.resume(); // keep draining
    const i = addr.lastIndexOf(':');
    host = addr.slice(0, i).replace(/^\[|\]$/g, '');
    port = Number(addr.slice(i + 1));
  } else {
    port = await freePort();
    host = '127.0.0.1';
    const file = path.join(dir, 'mosquitto.conf');
    writeFileSync(file, `listener ${port} 127.0.0.1\nallow_anonymous true\npersistence false\n` +
      `sys_interval ${conf.sys_interval}\n`);
    proc = spawn(process.env.MOSQUITTO || '/usr/sbin/mosquitto', ['-c', file],
      { cwd: dir, stdio: ['ignore', 'ignore', 'ignore'] });
    const deadline = Date.now() + 20_000;
    while (!(await portAccepts(port))) {
      if (Date.now() > deadline || proc.exitCode !== null) throw new Error('mosquitto did not start');
      await new Promise((r) => setTimeout(r, 20)); // polling a port: no event to wait for
    }
  }
  const exited = new Promise((resolve) => proc.once('exit', (code, signal) => resolve({ code, signal })));
  return {
    host, port, proc,
    url: `mqtt://${host}:${port}`,
    async stop() {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGTERM');
      const { code, signal } = await withTimeout(exited, 10_000, 'broker exit after SIGTERM');
      // Kept when the broker failed: its stderr log is there.
      if (code !== 0) throw new Error(`broker exited with ${code} (signal ${signal}) after SIGTERM; its files: ${dir}`);
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

// Connect an MQTT.js client and wait for CONNACK.
export async function connect(broker, opts = {}) {
  const client = mqtt.connect(broker.url, {
    reconnectPeriod: 0, connectTimeout: WAIT, protocolVersion: 5, ...opts,
  });
  await withTimeout(new Promise((resolve, reject) => {
    client.once('connect', resolve);
    client.once('error', reject);
  }), WAIT, 'CONNACK');
  client.messages = [];
  client.waiters = [];
  client.on('message', (topic, payload, packet) => {
    const m = { topic, payload, packet };
    const w = client.waiters.shift();
    if (w) w(m); else client.messages.push(m);
  });
  return client;
}

// The next message a client receives (in arrival order), with a timeout.
export function nextMessage(client, ms = WAIT) {
  if (client.messages.length) return Promise.resolve(client.messages.shift());
  return withTimeout(new Promise((resolve) => client.waiters.push(resolve)), ms, 'message');
}

// Tests listed in ../pending.txt as "js/<file>::<test name>" are skipped unless
// ZEROFAN_RUN_PENDING=1 (they are known to fail against zerofan for now).
function pendingNames() {
  const file = path.join(INTEROP, 'pending.txt');
  if (!existsSync(file)) return [];
  return readFileSync(file, 'utf8').split('\n')
    .map((l) => l.split('#')[0].trim()).filter((l) => l.startsWith('js/'));
}

export function itest(fileUrl, name, fn) {
  const id = `js/${path.basename(fileURLToPath(fileUrl))}::${name}`;
  const pending = BROKER === 'zerofan' && process.env.ZEROFAN_RUN_PENDING !== '1' &&
    pendingNames().some((p) => p === id || p === id.split('::')[0]);
  return test(name, { skip: pending ? 'zerofan_pending' : false, timeout: 60_000 }, fn);
}
