// Long heap tests (npm run test:heap), run under --expose-gc:
// 1. three 15 s streams of 3,840-byte messages at 100 per second; heapUsed
//    growth per second, measured after full collections, must be <= 0
//    within noise (NOISE_BPS);
// 2. the same messages at full speed for 10 s: process.memoryUsage().external
//    must stay bounded (no upward trend, below a cap) and the pool's
//    outstanding bytes must come back after collection.
import test from 'node:test'
import assert from 'node:assert/strict'
import v8 from 'node:v8'
import { zf, fullGc, sleep, checkPayload, until } from '../helpers.mjs'

const SIZE = 3840
const RATE = 100
const SECONDS = Number(process.env.HEAP_SECONDS || 15)
const ROUNDS = 3
// heapUsed after full collections moves between rounds for reasons that
// have nothing to do with the stream: V8 compiles and flushes code (the
// code space alone moved by -133 to +195 KB per round in our runs) and
// old-space bookkeeping of the test runner; single 15 s rounds measured
// from -6.9 to +7.1 KB/s. The noise allowance for the mean of three rounds
// is 4 KB/s (60 KB per round), below what leaking one Buffer object per
// message would show (>= 100 B x 100/s = 10 KB/s). The full-speed test
// below checks leaks far more tightly: per message, over ~10^5 messages.
const NOISE_BPS = 4096
// Heap growth allowed over the full-speed run: 1 MiB, whatever the count.
// The heap moves by a few hundred KB between collections on its own (code
// space, see above); a leak of even one small object per message (>= 64 B)
// over the >= 50,000 messages required would be >= 3 MB.
const FULL_SPEED_GROWTH = 1 << 20
const FULL_SPEED_MIN_MESSAGES = 50000
const EXTERNAL_CAP = 256 << 20

let broker

test.before(async () => {
  broker = await zf.startBroker({ port: 0 })
})

test.after(async () => {
  await broker.close()
})

function spaces () {
  return Object.fromEntries(v8.getHeapSpaceStatistics().map((s) => [s.space_name.replace('_space', ''), s.space_used_size]))
}

function spaceDelta (a, b) {
  return Object.keys(b).map((k) => `${k} ${((b[k] - a[k]) / 1024).toFixed(1)}`).filter((x) => !x.endsWith(' 0.0')).join(', ')
}

function kb (b) {
  return `${(b / 1024).toFixed(2)} KB`
}

async function stream (client, seconds, rate) {
  const pub = await zf.startLoadPublisher({ port: broker.port, topic: 'heap/audio', size: SIZE, rate, durationMs: seconds * 1000 })
  const r = await pub.done()
  return r.sent
}

test(`heapUsed growth: ${ROUNDS} x ${SECONDS} s of ${SIZE}-byte messages at ${RATE}/s`, async (t) => {
  const c = await zf.connectAsync(`mqtt://127.0.0.1:${broker.port}`)
  await c.subscribeAsync('heap/audio', { qos: 0 })
  let received = 0
  let bad = 0
  let checksum = 0
  c.on('message', (topic, payload) => {
    // What an audio consumer does: look at the samples.
    received++
    if (payload.length !== SIZE) bad++
    checksum = (checksum + payload[SIZE - 1] + payload[100]) & 0xffff
    if ((received & 63) === 0 && checkPayload(payload, SIZE) !== null) bad++
  })
  // Round 0 is a warm-up, the same as the others but not counted: code
  // paths compiled (the measuring code's too), pools and caches filled.
  const rates = []
  for (let round = 0; round <= ROUNDS; round++) {
    const secs0 = round === 0 ? Math.min(SECONDS, 5) : SECONDS
    await fullGc()
    const s0 = spaces()
    const m0 = process.memoryUsage()
    const n0 = received
    const t0 = performance.now()
    const sent = await stream(c, secs0, RATE)
    await sleep(100)
    const secs = (performance.now() - t0) / 1000
    await fullGc()
    const m1 = process.memoryUsage()
    const s1 = spaces()
    const got = received - n0
    const bps = (m1.heapUsed - m0.heapUsed) / secs
    if (round > 0) rates.push(bps)
    t.diagnostic(`${round === 0 ? 'warm-up' : 'round ' + round}: ${got}/${sent} messages in ${secs.toFixed(1)} s ` +
      `(${(got / secs).toFixed(1)}/s), heapUsed ${kb(m1.heapUsed - m0.heapUsed)} ` +
      `= ${bps.toFixed(0)} B/s, external ${kb(m1.external - m0.external)}, ` +
      `pool outstanding ${kb(c.getPoolStats().bytesOutstanding)}; by space (KB): ${spaceDelta(s0, s1)}`)
    assert.ok(got >= sent * 0.99, `received ${got} of ${sent}`)
  }
  const mean = rates.reduce((a, b) => a + b, 0) / rates.length
  t.diagnostic(`heapUsed growth: mean ${mean.toFixed(0)} B/s (${(mean / 1024).toFixed(2)} KB/s) ` +
    `over rounds [${rates.map((r) => r.toFixed(0)).join(', ')}] B/s; noise allowance ${NOISE_BPS} B/s; checksum ${checksum}`)
  assert.equal(bad, 0)
  assert.ok(mean <= NOISE_BPS, `heapUsed grows ${mean.toFixed(0)} B/s`)
  await c.endAsync()
})

test('external memory stays bounded at full speed for 10 s', async (t) => {
  const c = await zf.connectAsync(`mqtt://127.0.0.1:${broker.port}`)
  await c.subscribeAsync('heap/audio', { qos: 0 })
  let received = 0
  let bad = 0
  c.on('message', (topic, payload) => {
    received++
    if (payload.length !== SIZE || payload[SIZE - 1] !== ((Number(payload.readBigUInt64LE(8) & 0xffn) + SIZE - 17) & 0xff)) bad++
  })
  // Warm up the full-speed paths, then start from a collected heap.
  await stream(c, 1, 0)
  await sleep(300)
  await fullGc()
  const base = process.memoryUsage()
  const received0 = received
  const basePool = c.getPoolStats().bytesOutstanding
  const samples = []
  const timer = setInterval(() => {
    const m = process.memoryUsage()
    samples.push({ t: performance.now(), external: m.external, heapUsed: m.heapUsed, pool: c.getPoolStats().bytesOutstanding })
  }, 250)
  const t0 = performance.now()
  const sent = await stream(c, 10, 0)
  const secs = (performance.now() - t0) / 1000
  clearInterval(timer)
  const half = Math.floor(samples.length / 2)
  const maxOf = (arr, k) => Math.max(...arr.map((s) => s[k]))
  const first = maxOf(samples.slice(0, half), 'external')
  const second = maxOf(samples.slice(half), 'external')
  const peak = Math.max(first, second)
  t.diagnostic(`${received - received0} of ${sent} messages received in ${secs.toFixed(1)} s (${((received - received0) / secs).toFixed(0)}/s); ` +
    `external: base ${kb(base.external)}, max first half ${kb(first)}, max second half ${kb(second)}; ` +
    `heapUsed max ${kb(maxOf(samples, 'heapUsed'))}; pool outstanding max ${kb(maxOf(samples, 'pool'))}`)
  assert.equal(bad, 0)
  assert.ok(received > 0)
  assert.ok(peak < EXTERNAL_CAP, `external peaked at ${kb(peak)}`)
  assert.ok(second <= first * 1.5 + (16 << 20), `external trends up: ${kb(first)} then ${kb(second)}`)
  // Let the queue drain, then collect until the finalizers have run.
  await until(async () => {
    await sleep(100)
    await fullGc(2)
    return c.getPoolStats().bytesOutstanding <= basePool + (256 << 10)
  }, 10000, 'pool memory to come back').catch(() => {})
  const endPool = c.getPoolStats().bytesOutstanding
  const endMem = process.memoryUsage()
  const endExt = endMem.external
  const got = received - received0
  const perMessage = (endMem.heapUsed - base.heapUsed) / got
  t.diagnostic(`after collection: external ${kb(endExt)}, pool outstanding ${kb(endPool)} (before: ${kb(basePool)}); ` +
    `heapUsed ${kb(endMem.heapUsed - base.heapUsed)} over ${got} messages = ${perMessage.toFixed(3)} B/message`)
  assert.ok(got >= FULL_SPEED_MIN_MESSAGES, `only ${got} messages at full speed`)
  assert.ok(endMem.heapUsed - base.heapUsed < FULL_SPEED_GROWTH, `heapUsed grew ${kb(endMem.heapUsed - base.heapUsed)} (${perMessage.toFixed(3)} B per message)`)
  assert.ok(endPool <= basePool + (256 << 10), `pool outstanding ${kb(endPool)} after collection`)
  await c.endAsync()
})
