// Zero-copy payloads: contents under GC pressure, finalizers giving memory
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
