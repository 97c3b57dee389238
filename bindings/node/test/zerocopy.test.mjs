// Zero-copy payloads: views into one external ArrayBuffer per pooled read
// buffer and batch, contents under GC pressure, finalizers giving memory
// back to the pool, and the copy mode for comparison.
import test from 'node:test'
import assert from 'node:assert/strict'
import { zf, collect, fullGc, checkPayload, until } from './helpers.mjs'

let broker
let url

test.before(async () => {
  broker = await zf.startBroker({ port: 0, maxQueuedMessages: 100000 })
  url = `mqtt://127.0.0.1:${broker.port}`
})

test.after(async () => {
  await broker.close()
})

async function publisher (topic, size, count, rate) {
  const p = await zf.startLoadPublisher({ port: broker.port, topic, size, count, rate, qos: 1 })
  return p
}

test('payloads stay intact under GC pressure (20,000 messages, sizes 16 B to 20 KiB)', { timeout: 120000 }, async () => {
  const c = await zf.connectAsync(url, { poolSize: 8 << 20 })
  await c.subscribeAsync('zc/gc/#', { qos: 1 })
  const sizes = [16, 100, 3840, 20000]
  const per = 5000
  const kept = []
  let bad = null
  let n = 0
  let garbage = []
  let want = 0
  let reached = () => {}
  c.on('message', (topic, payload) => {
    const size = Number(topic.split('/')[2])
    const err = checkPayload(payload, size)
    if (err && !bad) bad = `${topic} #${n}: ${err}`
    // Keep a sample alive across many collections, make garbage, collect.
    if (n % 97 === 0) kept.push([size, payload])
    garbage.push(new Array(64).fill(n))
    if (++n % 1000 === 0) {
      garbage = []
      global.gc()
    }
    if (n === want) reached()
  })
  // One size after the other, paced at 16 MB/s at most so the broker's
  // session queue (64 MiB by default) never has to drop a QoS 1 message
  // for this subscriber on a slow machine.
  for (const s of sizes) {
    want += per
    const arrived = new Promise((resolve) => { reached = resolve })
    const rate = Math.min(20000, Math.floor(16e6 / s))
    await (await publisher(`zc/gc/${s}`, s, per, rate)).done()
    await Promise.race([arrived, new Promise((resolve) => setTimeout(resolve, 30000))])
    assert.equal(n, want, `received ${n} of ${want} messages`)
  }
  assert.equal(bad, null)
  await fullGc()
  for (const [size, payload] of kept) assert.equal(checkPayload(payload, size), null)
  assert.ok(kept.length > 200)
  await c.endAsync()
})

test('payloads of one read share one external ArrayBuffer: views, not copies', { timeout: 60000 }, async () => {
  const c = await zf.connectAsync(url, { poolSize: 16 << 20 })
  await c.subscribeAsync('zc/views', { qos: 1 })
  await fullGc()
  const before = c.getPoolStats()
  const n = 2000
  const size = 64
  const got = collect(c, n)
  // QoS 0 at full speed: the load publisher does not wait for PUBACKs, and
  // QoS 1 publishes still queued behind its inflight window when it
  // disconnects are not sent.
  await (await zf.startLoadPublisher({ port: broker.port, topic: 'zc/views', size, count: n, rate: 0, qos: 0 })).done()
  const payloads = (await got).map((m) => m.payload)
  assert.ok(payloads.every((p) => checkPayload(p, size) === null))
  const abs = new Map()
  for (const p of payloads) abs.set(p.buffer, (abs.get(p.buffer) || 0) + 1)
  // Payloads that arrived in one read and reached JavaScript in one batch
  // are views into one ArrayBuffer: far fewer ArrayBuffers than messages
  // (how many per read depends on the socket's timing; a 16 KiB read holds
  // up to ~190 of these packets). One shared by several payloads spans
  // from the first to the last of them: bigger than a payload.
  assert.ok(abs.size <= n / 2, `${abs.size} ArrayBuffers for ${n} payloads`)
  for (const [ab, count] of abs) {
    if (count > 1) assert.ok(ab.byteLength >= count * size, `ArrayBuffer of ${ab.byteLength} B for ${count} payloads`)
  }
  let shared = 0
  for (let i = 1; i < n; i++) {
    const [a, b] = [payloads[i - 1], payloads[i]]
    if (a.buffer === b.buffer) {
      shared++
      assert.ok(b.byteOffset >= a.byteOffset + a.length, 'in arrival order, not overlapping')
    }
  }
  assert.equal(shared, n - abs.size, 'each ArrayBuffer holds a run of consecutive payloads')
  // Not copies: the ArrayBuffers are the pool's read buffers, so holding
  // the payloads holds pool memory (no more than the reads took), and the
  // pool handed out about one buffer per read, not one per message.
  const holding = c.getPoolStats()
  const held = holding.bytesOutstanding - before.bytesOutstanding
  const abBytes = [...abs.keys()].reduce((t, ab) => t + ab.byteLength, 0)
  assert.ok(held >= abBytes, `outstanding grew ${held} B, ArrayBuffers ${abBytes} B`)
  // (+1: the reader's current, still empty buffer)
  assert.ok(holding.gets - before.gets <= abs.size + 1, `${holding.gets - before.gets} pool buffers, ${abs.size} ArrayBuffers`)
  // A write lands in the pool's memory: a view over the same bytes sees it.
  const p0 = payloads[0]
  const again = Buffer.from(p0.buffer, p0.byteOffset, p0.length)
  p0[20] ^= 0xff
  assert.equal(again[20], p0[20])
  await c.endAsync()
})

test('one kept payload keeps only its read buffer; dropping it gives that back', { timeout: 60000 }, async () => {
  const c = await zf.connectAsync(url, { poolSize: 64 << 20 })
  await c.subscribeAsync('zc/one', { qos: 1 })
  await fullGc()
  const before = c.getPoolStats()
  let kept = await (async () => {
    const got = collect(c, 2000)
    await (await publisher('zc/one', 3840, 2000, 0)).done()
    return (await got)[1000].payload
  })()
  await until(async () => {
    await fullGc(1)
    // The kept payload's read buffer, at most 64 KiB, and the reader's
    // current one (16 KiB, or 64 KiB after a read that filled its buffer).
    return c.getPoolStats().bytesOutstanding - before.bytesOutstanding <= 64 * 1024 + 64 * 1024
  }, 10000, 'the other read buffers to come back').catch((e) => {
    throw new Error(`${e.message}: ${JSON.stringify(c.getPoolStats())} before ${JSON.stringify(before)}`)
  })
  assert.ok(c.getPoolStats().bytesOutstanding - before.bytesOutstanding >= kept.length, 'the kept one is still out')
  assert.equal(checkPayload(kept, 3840), null)
  kept = null
  await until(async () => {
    await fullGc(1)
    // Only the reader's current buffer is out.
    return c.getPoolStats().bytesOutstanding <= before.bytesOutstanding + 64 * 1024
  }, 10000, 'the last read buffer to come back')
  await c.endAsync()
})

test('payloads are external: holding them holds pool memory; collecting them gives it back', { timeout: 60000 }, async () => {
  const c = await zf.connectAsync(url, { poolSize: 64 << 20 })
  await c.subscribeAsync('zc/hold', { qos: 1 })
  await fullGc()
  const before = c.getPoolStats()
  let held = await (async () => {
    const got = collect(c, 2000)
    await (await publisher('zc/hold', 3840, 2000, 0)).done()
    return (await got).map((m) => m.payload)
  })()
  const holding = c.getPoolStats()
  // 2,000 x 3,840 B = 7.7 MB of payload lives in pooled read buffers.
  assert.ok(holding.bytesOutstanding - before.bytesOutstanding >= 2000 * 3840,
    `outstanding ${holding.bytesOutstanding} (before ${before.bytesOutstanding})`)
  assert.ok(held.every((p) => checkPayload(p, 3840) === null))
  held = null
  await fullGc()
  await until(async () => {
    await fullGc(1)
    return c.getPoolStats().bytesOutstanding <= before.bytesOutstanding + 64 * 1024
  }, 10000, 'pool memory to come back').catch((e) => {
    throw new Error(`${e.message}: ${JSON.stringify(c.getPoolStats())} before ${JSON.stringify(before)}`)
  })
  const after = c.getPoolStats()
  assert.ok(after.returns > before.returns)
  assert.ok(after.bytesRetained > 0, 'returned buffers are kept for reuse')
  // A second round reuses them: hits, few new allocations.
  const got = collect(c, 2000)
  await (await publisher('zc/hold', 3840, 2000, 0)).done()
  await got
  const again = c.getPoolStats()
  assert.ok(again.hits > after.hits)
  assert.ok(again.hitRate > 0 && again.hitRate <= 1)
  assert.ok(again.allocations >= again.misses)
  await c.endAsync()
})

test('useExternalBuffer: false copies: holding payloads holds no pool memory', { timeout: 60000 }, async () => {
  const c = await zf.connectAsync(url, { useExternalBuffer: false, poolSize: 64 << 20 })
  await c.subscribeAsync('zc/copy', { qos: 1 })
  await fullGc()
  const got = collect(c, 2000)
  await (await publisher('zc/copy', 3840, 2000, 0)).done()
  const held = (await got).map((m) => m.payload)
  await fullGc()
  const st = c.getPoolStats()
  assert.ok(st.bytesOutstanding < 256 * 1024, `outstanding ${st.bytesOutstanding}`)
  assert.ok(held.every((p) => checkPayload(p, 3840) === null))
  await c.endAsync()
})

test('getPoolStats and configurePool on the shared pool', () => {
  const s = zf.getPoolStats()
  for (const k of ['hits', 'misses', 'allocations', 'hitRate', 'bytesOutstanding', 'bytesRetained', 'maxRetainedBytes']) {
    assert.equal(typeof s[k], 'number', k)
  }
  // The shared pool exists by now: the configuration is refused, warm-up done.
  assert.equal(zf.configurePool({ maxRetainedBytes: 1 << 20, warmUpCount: 2 }), false)
  assert.ok(zf.getPoolStats().allocations >= 2)
})

test('payload Buffer is writable and independent of other messages', async () => {
  const c = await zf.connectAsync(url)
  await c.subscribeAsync('zc/w', { qos: 1 })
  const got = collect(c, 3)
  const p = await zf.connectAsync(url)
  for (const s of ['aaaa', 'bbbb', 'cccc']) await p.publishAsync('zc/w', s, { qos: 1 })
  const msgs = await got
  msgs[1].payload.fill(0x7a)
  assert.deepEqual(msgs.map((m) => m.payload.toString()), ['aaaa', 'zzzz', 'cccc'])
  await p.endAsync()
  await c.endAsync()
})
