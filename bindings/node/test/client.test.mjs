// The MQTT.js-shaped API against the embedded broker.
import test from 'node:test'
import assert from 'node:assert/strict'
import { zf, collect, once, until, sleep } from './helpers.mjs'

let broker
let url

test.before(async () => {
  broker = await zf.startBroker({ host: '127.0.0.1', port: 0 })
  url = `mqtt://127.0.0.1:${broker.port}`
})

test.after(async () => {
  await broker.close()
})

test('connect emits connect; end emits close and end (callback form)', async () => {
  const c = zf.connect(url, { clientId: 'api-connect' })
  const [connack] = await once(c, 'connect')
  assert.equal(connack.cmd, 'connack')
  assert.equal(connack.sessionPresent, false)
  assert.equal(c.connected, true)
  assert.equal(c.options.clientId, 'api-connect')
  const closed = once(c, 'close')
  const ended = once(c, 'end')
  await new Promise((resolve, reject) => c.end((e) => (e ? reject(e) : resolve())))
  await closed
  await ended
  assert.equal(c.connected, false)
})

test('subscribe, publish and receive with callbacks, QoS 0, 1 and 2', async () => {
  const c = zf.connect(url)
  await once(c, 'connect')
  const granted = await new Promise((resolve, reject) =>
    c.subscribe({ 'cb/0': { qos: 0 }, 'cb/1': { qos: 1 }, 'cb/2': { qos: 2 } }, (e, g) => (e ? reject(e) : resolve(g)))
  )
  assert.deepEqual(granted, [{ topic: 'cb/0', qos: 0 }, { topic: 'cb/1', qos: 1 }, { topic: 'cb/2', qos: 2 }])
  const got = collect(c, 3)
  for (const q of [0, 1, 2]) {
    await new Promise((resolve, reject) =>
      c.publish(`cb/${q}`, `m${q}`, { qos: q }, (e) => (e ? reject(e) : resolve()))
    )
  }
  const msgs = (await got).sort((a, b) => a.topic.localeCompare(b.topic))
  assert.deepEqual(msgs.map((m) => [m.topic, m.payload.toString(), m.packet.qos]), [
    ['cb/0', 'm0', 0], ['cb/1', 'm1', 1], ['cb/2', 'm2', 2]
  ])
  for (const m of msgs) {
    assert.ok(Buffer.isBuffer(m.payload))
    assert.equal(m.packet.cmd, 'publish')
    assert.equal(m.packet.topic, m.topic)
    assert.equal(m.packet.payload, m.payload)
  }
  await c.endAsync()
})

test('promise forms: subscribeAsync, publishAsync, unsubscribeAsync, endAsync', async () => {
  const c = await zf.connectAsync(url)
  assert.deepEqual(await c.subscribeAsync(['p/a', 'p/b'], { qos: 1 }), [{ topic: 'p/a', qos: 1 }, { topic: 'p/b', qos: 1 }])
  const got = collect(c, 2)
  const ack = await c.publishAsync('p/a', Buffer.from([1, 2, 3]), { qos: 1 })
  assert.equal(ack.reasonCode, 0)
  await c.publishAsync('p/b', new Uint8Array([4, 5]), { qos: 2 })
  const msgs = await got
  assert.deepEqual(msgs.map((m) => [...m.payload]), [[1, 2, 3], [4, 5]])
  await c.unsubscribeAsync(['p/a', 'p/b'])
  let late = 0
  c.on('message', () => late++)
  await c.publishAsync('p/a', 'after', { qos: 1 })
  await sleep(200)
  assert.equal(late, 0)
  await c.endAsync()
})

test('operations before CONNACK wait for the connection', async () => {
  const c = zf.connect(url)
  const got = collect(c, 1)
  c.subscribe('early/t', { qos: 1 })
  c.publish('early/t', 'queued', { qos: 1 })
  const [m] = await got
  assert.equal(m.payload.toString(), 'queued')
  await c.endAsync()
})

test('retained message and retain flag; MQTT 5 properties round trip', async () => {
  const pub = await zf.connectAsync(url)
  await pub.publishAsync('ret/t', 'kept', {
    qos: 1,
    retain: true,
    properties: { contentType: 'text/plain', userProperties: { a: '1', b: ['x', 'y'] }, correlationData: Buffer.from('cd'), responseTopic: 'resp/t' }
  })
  const sub = await zf.connectAsync(url)
  const got = collect(sub, 1)
  await sub.subscribeAsync('ret/t', { qos: 1 })
  const [m] = await got
  assert.equal(m.payload.toString(), 'kept')
  assert.equal(m.packet.retain, true)
  assert.equal(m.packet.properties.contentType, 'text/plain')
  assert.equal(m.packet.properties.responseTopic, 'resp/t')
  assert.equal(m.packet.properties.correlationData.toString(), 'cd')
  assert.deepEqual(m.packet.properties.userProperties, { a: '1', b: ['x', 'y'] })
  await pub.publishAsync('ret/t', '', { qos: 1, retain: true })
  await pub.endAsync()
  await sub.endAsync()
})

test('MQTT 3.1.1 works too', async () => {
  const c = await zf.connectAsync(url, { protocolVersion: 4 })
  await c.subscribeAsync('v4/t', { qos: 2 })
  const got = collect(c, 1)
  await c.publishAsync('v4/t', 'three-one-one', { qos: 2 })
  assert.equal((await got)[0].payload.toString(), 'three-one-one')
  await c.endAsync()
})

test('connect failure emits error and close; connectAsync rejects', async () => {
  await assert.rejects(zf.connectAsync('mqtt://127.0.0.1:1', { reconnectPeriod: 0, connectTimeout: 2000 }))
  const c = zf.connect('mqtt://127.0.0.1:1', { reconnectPeriod: 0 })
  const errs = []
  c.on('error', (e) => errs.push(e))
  await once(c, 'close')
  assert.equal(errs.length, 1)
  await c.endAsync()
})

test('failed first attempt retries with reconnect until end()', async () => {
  const c = zf.connect('mqtt://127.0.0.1:1', { reconnectPeriod: 50 })
  c.on('error', () => {})
  await once(c, 'reconnect')
  await once(c, 'reconnect')
  await c.endAsync()
  assert.equal(c.disconnected, true)
})

test('will message is published when a client vanishes', async () => {
  const watcher = await zf.connectAsync(url)
  await watcher.subscribeAsync('will/t', { qos: 1 })
  const got = collect(watcher, 1)
  // The client vanishes without DISCONNECT: its socket is cut at a proxy.
  const net = await import('node:net')
  const sockets = []
  const proxy = net.createServer((s) => {
    const up = net.connect(broker.port, '127.0.0.1')
    sockets.push(s, up)
    s.pipe(up).pipe(s)
    s.on('error', () => {})
    up.on('error', () => {})
  })
  await new Promise((resolve) => proxy.listen(0, '127.0.0.1', resolve))
  const w = await zf.connectAsync(`mqtt://127.0.0.1:${proxy.address().port}`, {
    will: { topic: 'will/t', payload: 'gone', qos: 1 },
    reconnectPeriod: 0
  })
  w.on('error', () => {})
  for (const s of sockets) s.destroy()
  const [m] = await got
  assert.equal(m.payload.toString(), 'gone')
  await w.endAsync()
  proxy.close()
  await watcher.endAsync()
})

test('reconnect: a cut connection emits offline, close, reconnect, connect and resumes delivery', async () => {
  const net = await import('node:net')
  const sockets = []
  const proxy = net.createServer((s) => {
    const up = net.connect(broker.port, '127.0.0.1')
    sockets.push(s, up)
    s.pipe(up).pipe(s)
    s.on('error', () => {})
    up.on('error', () => {})
  })
  await new Promise((resolve) => proxy.listen(0, '127.0.0.1', resolve))
  const c = await zf.connectAsync(`mqtt://127.0.0.1:${proxy.address().port}`, { reconnectPeriod: 50 })
  c.on('error', () => {})
  await c.subscribeAsync('rc/t', { qos: 1 })
  const events = []
  for (const e of ['offline', 'close', 'reconnect', 'connect']) c.on(e, () => events.push(e))
  for (const s of sockets.splice(0)) s.destroy()
  await until(() => events.includes('connect'), 5000, 'reconnect')
  assert.deepEqual(events, ['offline', 'close', 'reconnect', 'connect'])
  const got = collect(c, 1)
  const p = await zf.connectAsync(url)
  await p.publishAsync('rc/t', 'again', { qos: 1 })
  assert.equal((await got)[0].payload.toString(), 'again')
  await p.endAsync()
  await c.endAsync()
  proxy.close()
})

test('embedded broker: stats move (read from the core, $SYS off), close() ends it', async () => {
  const b = await zf.startBroker({ port: 0, sysInterval: 0 })
  const s0 = b.stats()
  assert.equal(s0.clientsConnected, 0)
  assert.equal(s0.messagesReceived, 0)
  const c = await zf.connectAsync(`mqtt://127.0.0.1:${b.port}`, { reconnectPeriod: 0 })
  await c.subscribeAsync('s/t')
  for (let i = 0; i < 10; i++) await c.publishAsync('s/t', 'x', { qos: 1 })
  await until(() => b.stats().messagesReceived >= 10, 5000, 'broker stats')
  const st = b.stats()
  assert.equal(st.messagesReceived, 10)
  assert.equal(st.clientsConnected, 1)
  assert.equal(st.subscriptions, 1)
  assert.ok(st.bytesReceived > 0)
  assert.equal(st.sys['messages/received'], '10')
  assert.equal(st.sys['clients/connected'], '1')
  // latestStats(): what stats() just took, without a round trip; the
  // broker thread refreshes it by itself every half second too.
  const l = b.latestStats()
  assert.equal(l.messagesReceived, 10)
  assert.equal(l.clientsConnected, 1)
  assert.equal(l.sys['messages/received'], '10')
  await c.publishAsync('s/t', 'x', { qos: 1 })
  await until(() => b.latestStats().messagesReceived === 11, 5000, 'latestStats to refresh by itself')
  // close(): the MQTT 5 client is told the server is shutting down.
  const closed = new Promise((resolve) => c.once('close', resolve))
  await b.close()
  await closed
  assert.ok(b.stats().messagesReceived >= 10, 'the figures taken as close() began')
  assert.ok(b.latestStats().messagesReceived >= 10)
  await assert.rejects(zf.connectAsync(`mqtt://127.0.0.1:${b.port}`, { reconnectPeriod: 0 }))
  await c.endAsync()
})

test('embedded broker with threads: 4 serves clients on every shard', async () => {
  const b = await zf.startBroker({ port: 0, sysInterval: 0, threads: 4 })
  const url = `mqtt://127.0.0.1:${b.port}`
  const subs = []
  for (let i = 0; i < 8; i++) {
    const c = await zf.connectAsync(url, { clientId: `shard-sub-${i}`, reconnectPeriod: 0 })
    await c.subscribeAsync('sh/#', { qos: 1 })
    subs.push(c)
  }
  const got = subs.map((c) => new Promise((resolve) => c.once('message', (t, p) => resolve(p.toString()))))
  const p = await zf.connectAsync(url, { clientId: 'shard-pub', reconnectPeriod: 0 })
  await p.publishAsync('sh/x', 'everywhere', { qos: 1 })
  assert.deepEqual(await Promise.all(got), Array(8).fill('everywhere'))
  // stats() adds every shard's figures.
  await until(() => b.stats().messagesSent === 8 && b.stats().clientsConnected === 9, 5000, 'totals over shards')
  assert.equal(b.stats().subscriptions, 8)
  for (const c of [...subs, p]) await c.endAsync()
  await b.close()
})

test('embedded broker with dataDir keeps retained messages across a restart', async () => {
  const { mkdtempSync, rmSync } = await import('node:fs')
  const os = await import('node:os')
  const path = await import('node:path')
  const dir = mkdtempSync(path.join(os.tmpdir(), 'zerofan-node-data-'))
  try {
    let b = await zf.startBroker({ port: 0, dataDir: dir })
    const p = await zf.connectAsync(`mqtt://127.0.0.1:${b.port}`)
    await p.publishAsync('persist/t', 'survives', { qos: 1, retain: true })
    await p.endAsync()
    await b.close()
    b = await zf.startBroker({ port: 0, dataDir: dir })
    const s = await zf.connectAsync(`mqtt://127.0.0.1:${b.port}`)
    const got = collect(s, 1)
    await s.subscribeAsync('persist/t', { qos: 1 })
    assert.equal((await got)[0].payload.toString(), 'survives')
    await s.endAsync()
    await b.close()
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
})

test('startBroker rejects a port in use', async () => {
  await assert.rejects(zf.startBroker({ port: broker.port }), /failed to start/)
})

test('a busy stream arrives complete and in order, and timers still run between batches', { timeout: 60000 }, async () => {
  // A broker of its own whose session queue holds the whole stream, so
  // that it drops nothing however far the publisher runs ahead.
  const big = await zf.startBroker({ host: '127.0.0.1', port: 0, sysInterval: 0, maxQueuedMessages: 200000 })
  const c = await zf.connectAsync(big.url, { batchSize: 256 })
  await c.subscribeAsync('busy/order', { qos: 1 })
  const count = 100000
  let n = 0
  let outOfOrder = null
  let done
  const all = new Promise((resolve) => { done = resolve })
  c.on('message', (topic, payload) => {
    const seq = Number(payload.readBigUInt64LE(8))
    if (seq !== n && outOfOrder === null) outOfOrder = `message #${n} has sequence ${seq}`
    if (++n === count) done()
  })
  // A 1 ms timer: the longest gap between its ticks while the stream runs
  // tells whether batches taken synchronously starve the event loop.
  let last = performance.now()
  let maxGap = 0
  const timer = setInterval(() => {
    const now = performance.now()
    if (n > 0 && n < count) maxGap = Math.max(maxGap, now - last)
    last = now
  }, 1)
  const p = await zf.startLoadPublisher({ port: big.port, topic: 'busy/order', size: 16, count, qos: 1 })
  let giveUp
  await Promise.race([all, new Promise((resolve) => { giveUp = setTimeout(resolve, 50000) })])
  clearTimeout(giveUp)
  clearInterval(timer)
  await p.done()
  assert.equal(n, count, `received ${n} of ${count}`)
  assert.equal(outOfOrder, null)
  assert.ok(maxGap < 250, `timers waited ${maxGap.toFixed(0)} ms`)
  await c.endAsync()
  await big.close()
})
