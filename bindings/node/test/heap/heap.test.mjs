// Long heap tests (npm run test:heap), run under --expose-gc:
// 1. three 15 s streams of 3,840-byte messages at 100 per second; heapUsed
//    growth per second, measured after full collections, must be <= 0
//    within noise (NOISE_BPS);
// 2. the same messages at full speed for 10 s: process.memoryUsage().external
//    must stay bounded (no upward trend, below a cap) and the pool's
//    outstanding bytes must come back after collection.
import test from 'node:test'
import assert from 'node:assert/strict'
import { zf, fullGc, sleep, checkPayload, until } from '../helpers.mjs'
import { NOISE_BPS, sampleHeap, medianSlope, sampleList, kb } from './growth.mjs'

const SIZE = 3840
const RATE = 100
const SECONDS = Number(process.env.HEAP_SECONDS || 15)
const ROUNDS = 3
// The heapUsed growth of the three rounds is measured as growth.mjs says
// (the median slope of samples taken after full collections every second),
// with its allowance of 4 KB/s: below what leaking one Buffer object per
// message would show (>= 100 B x 100/s = 10 KB/s). The full-speed test
// below checks leaks far more tightly: per message, over ~10^5 messages.
//
// Heap growth allowed over the full-speed run: 1 MiB, whatever the count.
// The heap moves by a few hundred KB between collections on its own (code
// space, see growth.mjs); a leak of even one small object per message (>= 64 B)
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
  // paths compiled (the measuring code's too), pools and caches filled. As
  // long as the others: after a 5 s warm-up, old space still grew by 50 KB
  // in the first 15 s round.
  const rounds = []
  for (let round = 0; round <= ROUNDS; round++) {
    await fullGc()
    const m0 = process.memoryUsage()
    const n0 = received
    const t0 = performance.now()
    // The stream starts, then heapUsed is sampled while it runs.
    const sending = stream(c, SECONDS, RATE)
    const { samples, spaces } = await sampleHeap(SECONDS)
    const sent = await sending
    await sleep(100)
    const secs = (performance.now() - t0) / 1000
    const m1 = process.memoryUsage()
    const got = received - n0
    if (round > 0) rounds.push(samples)
    const base = rounds.length > 0 ? rounds[0][0][1] : samples[0][1]
    t.diagnostic(`${round === 0 ? 'warm-up' : 'round ' + round}: ${got}/${sent} messages in ${secs.toFixed(1)} s ` +
      `(${(got / secs).toFixed(1)}/s), heapUsed ${kb(samples[samples.length - 1][1] - samples[0][1])} ` +
      `= ${medianSlope(samples).toFixed(0)} B/s, external ${kb(m1.external - m0.external)}, ` +
      `pool outstanding ${kb(c.getPoolStats().bytesOutstanding)}; by space (KB): ${spaces}; samples (KB): ${sampleList(samples, base)}`)
    assert.ok(got >= sent * 0.99, `received ${got} of ${sent}`)
  }
  const all = rounds.flat()
  const growth = medianSlope(all)
  t.diagnostic(`heapUsed growth: ${growth.toFixed(0)} B/s (${(growth / 1024).toFixed(2)} KB/s) over ${ROUNDS} rounds; ` +
    `noise allowance ${NOISE_BPS} B/s; checksum ${checksum}`)
  assert.equal(bad, 0)
  assert.ok(growth <= NOISE_BPS, `heapUsed grows ${growth.toFixed(0)} B/s`)
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
