// The dashboard page in a real browser: headless Chromium (Debian's, driven
// by playwright-core) loads http://.../#token=... against a broker with
// MQTT.js clients connected, and checks what the page shows against the
// API; kicks a client through the page; keeps a screenshot under
// $CARGO_TARGET_DIR (or target/) as dashboard.png. zerofan only.
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync, mkdirSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { once } from 'node:events';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';
import { BROKER, startBroker, connect, itest, withTimeout, WAIT } from './broker.mjs';

const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', '..');
const TOKEN = 'dash-token-for-tests';
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';

async function freePort() {
  const srv = createServer();
  srv.listen(0, '127.0.0.1');
  await once(srv, 'listening');
  const { port } = srv.address();
  srv.close();
  await once(srv, 'close');
  return port;
}

itest(import.meta.url, 'dashboard shows clients and stats, kicks a client', async (t) => {
  if (BROKER !== 'zerofan') return t.skip('zerofan only');
  const dir = mkdtempSync(path.join(tmpdir(), 'zerofan-dash-'));
  const tokens = path.join(dir, 'tokens');
  writeFileSync(tokens, `# dashboard test\n${TOKEN}\n`);
  const port = await freePort();
  const base = `http://127.0.0.1:${port}`;
  const broker = await startBroker({ http: `127.0.0.1:${port}`, http_tokens_file: tokens });
  const clients = [];
  const browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'],
  });
  t.after(async () => {
    await browser.close();
    for (const c of clients) c.end(true);
    await broker.stop();
    rmSync(dir, { recursive: true, force: true });
  });
  for (const id of ['dash-alpha', 'dash-beta', 'dash-gamma']) {
    clients.push(await connect(broker, { clientId: id }));
  }
  await clients[0].subscribeAsync('dash/#');
  await clients[2].publishAsync('dash/retained/one', 'hello', { retain: true });

  const api = async (p, init = {}) => {
    const r = await fetch(`${base}/api/v1/${p}`, {
      ...init, headers: { Authorization: `Bearer ${TOKEN}` },
    });
    return { status: r.status, body: await r.json() };
  };

  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  const problems = [];
  page.on('pageerror', (e) => problems.push(String(e)));
  // Script errors only: the first load's 401 (no token yet) and the
  // favicon's 404 are logged by the browser as failed resource loads.
  page.on('console', (m) => {
    if (m.type() === 'error' && !m.text().startsWith('Failed to load resource')) problems.push(m.text());
  });

  // Without a token the page asks for one.
  await page.goto(base + '/');
  await page.waitForSelector('#login', { state: 'visible', timeout: WAIT });

  await page.goto(`${base}/#token=${TOKEN}`);
  await page.waitForSelector('body[data-loaded="true"]', { timeout: WAIT });
  // The token is kept in the tab's session storage, not in the address.
  assert.equal(await page.evaluate(() => sessionStorage.getItem('zerofan-token')), TOKEN);
  assert.ok(!page.url().includes(TOKEN), page.url());

  for (const id of ['dash-alpha', 'dash-beta', 'dash-gamma']) {
    await page.waitForSelector(`#clients tbody tr[data-clientid="${id}"]`, { timeout: WAIT });
  }
  const stats = (await api('stats')).body;
  assert.equal(stats.connections, 3);
  const shown = async (id, want) => page.waitForFunction(
    ([el, v]) => document.getElementById(el).textContent === v, [id, want], { timeout: WAIT });
  await shown('connections', String(stats.connections));
  await shown('subscriptions', String(stats.subscriptions));
  await shown('retained', String(stats.retained));
  await page.waitForFunction(
    () => document.getElementById('tree').textContent.includes('one = hello'), null, { timeout: WAIT });
  const rows = await page.locator('#clients tbody tr').count();
  assert.equal(rows, (await api('clients')).body.total);

  // A client's detail: its subscriptions, from the API.
  await page.click('#clients tbody tr[data-clientid="dash-alpha"] td');
  await page.waitForFunction(
    () => document.getElementById('detail').textContent.includes('"filter": "dash/#"'), null, { timeout: WAIT });

  // The publish form reaches a subscriber.
  const alpha = clients[0];
  const got = withTimeout(new Promise((resolve) => alpha.once('message', (topic, payload) => resolve([topic, String(payload)]))), WAIT, 'message');
  await page.fill('#publish input[name=topic]', 'dash/from-page');
  await page.fill('#publish textarea[name=payload]', 'clicked');
  await page.click('#publish button');
  assert.deepEqual(await got, ['dash/from-page', 'clicked']);
  await page.waitForFunction(
    () => document.getElementById('publish-result').textContent === 'delivered to 1', null, { timeout: WAIT });

  // Kick dash-beta from the page: it gets DISCONNECT 0x98 and leaves the table.
  const beta = clients[1];
  const kicked = withTimeout(new Promise((resolve) => beta.once('disconnect', resolve)), WAIT, 'DISCONNECT');
  await page.click('#clients tbody tr[data-clientid="dash-beta"] button.kick');
  const packet = await kicked;
  assert.equal(packet.reasonCode, 0x98);
  await page.waitForSelector('#clients tbody tr[data-clientid="dash-beta"]', { state: 'detached', timeout: WAIT });
  assert.equal((await api('clients/dash-beta')).status, 404);
  await shown('connections', '2');

  const out = path.resolve(REPO, process.env.CARGO_TARGET_DIR || 'target');
  mkdirSync(out, { recursive: true });
  const shot = path.join(out, 'dashboard.png');
  await page.screenshot({ path: shot, fullPage: true });
  console.log(`dashboard screenshot: ${shot}`);
  assert.deepEqual(problems, []);
});
