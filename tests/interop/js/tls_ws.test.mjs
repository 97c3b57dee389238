// MQTT.js against zerofan over mqtts, wss and ws, with mutual TLS and a
// password file. Certificates are made at test time by ../secutil.py (the
// Python `cryptography` package from the interop venv).
import assert from 'node:assert/strict';
import { spawn, execFileSync } from 'node:child_process';
import { mkdtempSync, writeFileSync, readFileSync, existsSync, openSync, closeSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before } from 'node:test';
import mqtt from 'mqtt';
import { BROKER, WAIT, withTimeout, itest } from './broker.mjs';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const INTEROP = path.dirname(HERE);
const REPO = path.resolve(INTEROP, '..', '..');
const skip = BROKER !== 'zerofan';

function python() {
  const venv = path.join(REPO, '.venv', 'bin', 'python');
  return existsSync(venv) ? venv : 'python3';
}

function zerofanBin() {
  if (process.env.ZEROFAN_BIN) return process.env.ZEROFAN_BIN;
  return path.join(path.resolve(REPO, process.env.CARGO_TARGET_DIR || 'target'), 'release', 'zerofan');
}

let dir, certs, proc, ports;

async function startSecure() {
  dir = mkdtempSync(path.join(tmpdir(), 'zerofan-tls-'));
  execFileSync(python(), [path.join(INTEROP, 'secutil.py'), 'certs', dir]);
  const f = (n) => path.join(dir, n);
  certs = { ca: readFileSync(f('ca.pem')), cert: readFileSync(f('alice.pem')), key: readFileSync(f('alice-key.pem')) };
  execFileSync(zerofanBin(), ['passwd', '-c', '-b', 'secret', f('passwd'), 'jsuser']);
  const tls = `tls = { cert = ${JSON.stringify(f('server.pem'))}, key = ${JSON.stringify(f('server-key.pem'))} }\n`;
  const mtls = `tls = { cert = ${JSON.stringify(f('server.pem'))}, key = ${JSON.stringify(f('server-key.pem'))}, ca = ${JSON.stringify(f('ca.pem'))}, require_certificate = true }\n`;
  const conf = `password_file = ${JSON.stringify(f('passwd'))}\nallow_anonymous = true\n` +
    `[[listener]]\nbind = "127.0.0.1:0"\n${tls}` +
    `[[listener]]\nbind = "127.0.0.1:0"\nprotocol = "websockets"\n${tls}` +
    `[[listener]]\nbind = "127.0.0.1:0"\nprotocol = "websockets"\n` +
    `[[listener]]\nbind = "127.0.0.1:0"\n${mtls}` +
    `[[listener]]\nbind = "127.0.0.1:0"\nallow_anonymous = false\n${tls}`;
  writeFileSync(f('zerofan.toml'), conf);
  const log = openSync(f('stderr.log'), 'w');
  // The suite's shards (ZEROFAN_THREADS, default 1), as broker.mjs.
  const threads = String(process.env.ZEROFAN_THREADS || 1);
  proc = spawn(zerofanBin(), ['--memory', '--threads', threads, '-c', f('zerofan.toml')], { cwd: dir, stdio: ['ignore', 'pipe', log] });
  closeSync(log);
  ports = await withTimeout(new Promise((resolve, reject) => {
    let buf = '';
    proc.stdout.on('data', (chunk) => {
      buf += chunk.toString();
      const found = [...buf.matchAll(/zerofan listening on \S+:(\d+)/g)].map((m) => Number(m[1]));
      if (found.length >= 5) resolve(found);
    });
    proc.once('exit', (code) => reject(new Error(`zerofan exited ${code}`)));
  }), 20_000, 'listening lines');
  proc.stdout.resume();
}

function open(url, opts = {}) {
  const client = mqtt.connect(url, {
    reconnectPeriod: 0, connectTimeout: WAIT, protocolVersion: 5, ca: certs.ca, ...opts,
  });
  return withTimeout(new Promise((resolve, reject) => {
    client.once('connect', () => resolve(client));
    client.once('error', (e) => { client.end(true); reject(e); });
    client.once('close', () => reject(new Error('closed before CONNACK')));
  }), WAIT, `CONNACK from ${url}`);
}

function nextMessage(client) {
  return withTimeout(new Promise((resolve) => client.once('message', (t, p) => resolve([t, p.toString()]))), WAIT, 'message');
}

before(async () => { if (!skip) await startSecure(); });
after(async () => {
  if (!proc) return;
  const exited = new Promise((resolve) => proc.once('exit', (code) => resolve(code)));
  proc.kill('SIGTERM');
  assert.equal(await withTimeout(exited, 10_000, 'exit'), 0, `zerofan's files: ${dir}`);
  rmSync(dir, { recursive: true, force: true });
});

const t = skip ? (name) => itest(import.meta.url, name, (tc) => tc.skip('zerofan only')) : (name, fn) => itest(import.meta.url, name, fn);

t('mqtts and wss and ws carry the same messages', async () => {
  const mqtts = await open(`mqtts://localhost:${ports[0]}`);
  const wss = await open(`wss://localhost:${ports[1]}/mqtt`);
  const ws = await open(`ws://127.0.0.1:${ports[2]}/mqtt`, { protocolVersion: 4 });
  try {
    await mqtts.subscribeAsync('js/#', { qos: 1 });
    await wss.subscribeAsync('js/#', { qos: 1 });
    const a = nextMessage(mqtts);
    const b = nextMessage(wss);
    await ws.publishAsync('js/hello', 'over ws', { qos: 1 });
    assert.deepEqual(await a, ['js/hello', 'over ws']);
    assert.deepEqual(await b, ['js/hello', 'over ws']);
    const big = 'z'.repeat(200_000);
    const c = nextMessage(mqtts);
    await wss.publishAsync('js/big', big, { qos: 1 });
    assert.equal((await c)[1].length, big.length);
  } finally {
    mqtts.end(true); wss.end(true); ws.end(true);
  }
});

t('mutual TLS: client certificate accepted, none refused', async () => {
  const ok = await open(`mqtts://localhost:${ports[3]}`, { cert: certs.cert, key: certs.key });
  ok.end(true);
  await assert.rejects(open(`mqtts://localhost:${ports[3]}`));
});

t('password file over mqtts: good, bad, anonymous', async () => {
  const ok = await open(`mqtts://localhost:${ports[4]}`, { username: 'jsuser', password: 'secret' });
  ok.end(true);
  await assert.rejects(open(`mqtts://localhost:${ports[4]}`, { username: 'jsuser', password: 'nope' }),
    (e) => e.code === 134);
  await assert.rejects(open(`mqtts://localhost:${ports[4]}`), (e) => e.code === 135);
});
