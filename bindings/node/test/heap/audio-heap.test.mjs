// Heap test of issue 9 on captured audio (npm run test:heap, --expose-gc):
// a 440 Hz tone captured from a throwaway PulseAudio null sink's monitor
// (test/pulse.mjs) as 10 ms packets (48 kHz stereo f32: 3,840 bytes, the
// size of issue 9's messages) in external Buffers; after a warm-up round,
// three 15 s rounds; heapUsed growth per second (the slope of heapUsed
// sampled after a full collection every second), must be <= 0 within the
// same noise allowance as heap.test.mjs.
import test from 'node:test'
import assert from 'node:assert/strict'
import { zf, fullGc, sleep, until } from '../helpers.mjs'
import { startPulse } from '../pulse.mjs'

const SECONDS = Number(process.env.HEAP_SECONDS || 15)
const ROUNDS = 3
const NOISE_BPS = 4096 // see heap.test.mjs
const DEVICE = process.env.ZF_AUDIO_DEVICE || 'alsa:pulse'

/** Least-squares slope of [x, y] points (bytes per second here). */
function slope (points) {
  const n = points.length
  const mx = points.reduce((a, [x]) => a + x, 0) / n
  const my = points.reduce((a, [, y]) => a + y, 0) / n
  let num = 0
  let den = 0
  for (const [x, y] of points) {
    num += (x - mx) * (y - my)
    den += (x - mx) * (x - mx)
  }
  return den > 0 ? num / den : 0
}

function kb (b) {
  return `${(b / 1024).toFixed(2)} KB`
}

test(`captured audio: heapUsed growth over ${ROUNDS} x ${SECONDS} s`, async (t) => {
  await startPulse()
  const c = zf.capture({ device: DEVICE, sampleRate: 48000, channels: 2, format: 'f32' })
  let received = 0
  let bad = 0
  let checksum = 0
  let lastSeq = -1
  let gaps = 0
  c.on('error', (e) => t.diagnostic(`capture error ${e.code}: ${e.message}`))
  c.on('data', (buf, info) => {
    // What a speech-recognition consumer does: look at the samples.
    received++
    if (buf.length !== 3840) bad++
    if (lastSeq >= 0 && info.seq !== lastSeq + 1) gaps++
    lastSeq = info.seq
    checksum = (checksum + buf[100] + buf[3839]) & 0xffff
  })
  const ended = new Promise((resolve) => c.on('end', resolve))
  await until(() => received >= 50, 20000, 'audio from the PulseAudio monitor')
  const rates = []
  for (let round = 0; round <= ROUNDS; round++) {
    // Round 0 (warm-up, not counted) is as long as the others: the first
    // 15 s still compile code and fill caches (+211 KB in one run).
    // heapUsed after a full collection once a second; the round's growth
    // is the least-squares slope of those samples, which one sample that
    // happens to land high or low (the heap moves by tens of KB between
    // collections on its own) moves far less than a difference of two.
    await fullGc()
    const m0 = process.memoryUsage()
    const n0 = received
    const t0 = performance.now()
    const samples = [[0, m0.heapUsed]]
    for (let i = 1; i <= SECONDS; i++) {
      await sleep(Math.max(0, t0 + i * 1000 - performance.now()))
      await fullGc()
      samples.push([(performance.now() - t0) / 1000, process.memoryUsage().heapUsed])
    }
    const secs = (performance.now() - t0) / 1000
    const m1 = process.memoryUsage()
    const got = received - n0
    const bps = slope(samples)
    if (round > 0) rates.push(bps)
    const s = c.getStats()
    t.diagnostic(`${round === 0 ? 'warm-up' : 'round ' + round}: ${got} packets in ${secs.toFixed(1)} s ` +
      `(${(got / secs).toFixed(1)}/s), heapUsed ${kb(m1.heapUsed - m0.heapUsed)} = ${bps.toFixed(0)} B/s, ` +
      `external ${kb(m1.external - m0.external)}, pool outstanding ${kb(s.pool.outstandingBytes)}, drops ${s.drops}`)
    assert.ok(got > 0, 'audio kept flowing')
  }
  c.stop()
  await ended
  const s = c.getStats()
  const mean = rates.reduce((a, b) => a + b, 0) / rates.length
  t.diagnostic(`heapUsed growth: mean ${mean.toFixed(0)} B/s (${(mean / 1024).toFixed(2)} KB/s) over rounds ` +
    `[${rates.map((r) => r.toFixed(0)).join(', ')}] B/s; noise allowance ${NOISE_BPS} B/s; ${received} packets, ` +
    `gaps ${gaps}, drops ${s.drops}; checksum ${checksum}`)
  assert.equal(bad, 0)
  assert.equal(gaps, 0)
  assert.equal(s.drops, 0)
  assert.ok(mean <= NOISE_BPS, `heapUsed grows ${mean.toFixed(0)} B/s`)
})
