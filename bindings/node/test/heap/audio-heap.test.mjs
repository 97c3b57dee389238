// Heap test of issue 9 on captured audio (npm run test:heap, --expose-gc):
// a 440 Hz tone captured from a throwaway PulseAudio null sink's monitor
// (test/pulse.mjs) as 10 ms packets (48 kHz stereo f32: 3,840 bytes, the
// size of issue 9's messages) in external Buffers; after a warm-up round,
// three 15 s rounds; heapUsed growth per second (the median slope of
// heapUsed sampled after a full collection every second over the three
// rounds, see growth.mjs) must be <= 0 within the same noise allowance as
// heap.test.mjs.
import test from 'node:test'
import assert from 'node:assert/strict'
import { zf, until } from '../helpers.mjs'
import { startPulse } from '../pulse.mjs'
import { NOISE_BPS, sampleHeap, medianSlope, sampleList, kb } from './growth.mjs'

const SECONDS = Number(process.env.HEAP_SECONDS || 15)
const ROUNDS = 3
const DEVICE = process.env.ZF_AUDIO_DEVICE || 'alsa:pulse'

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
  const rounds = []
  for (let round = 0; round <= ROUNDS; round++) {
    // Round 0 (warm-up, not counted) is as long as the others: the first
    // 15 s still compile code and fill caches (+211 KB in one run).
    const n0 = received
    const t0 = performance.now()
    const m0 = process.memoryUsage()
    const { samples, spaces } = await sampleHeap(SECONDS)
    const secs = (performance.now() - t0) / 1000
    const m1 = process.memoryUsage()
    const got = received - n0
    if (round > 0) rounds.push(samples)
    const base = rounds.length > 0 ? rounds[0][0][1] : samples[0][1]
    const s = c.getStats()
    t.diagnostic(`${round === 0 ? 'warm-up' : 'round ' + round}: ${got} packets in ${secs.toFixed(1)} s ` +
      `(${(got / secs).toFixed(1)}/s), heapUsed ${kb(samples[samples.length - 1][1] - samples[0][1])} = ${medianSlope(samples).toFixed(0)} B/s, ` +
      `external ${kb(m1.external - m0.external)}, pool outstanding ${kb(s.pool.outstandingBytes)}, drops ${s.drops}; ` +
      `by space (KB): ${spaces}; samples (KB): ${sampleList(samples, base)}`)
    assert.ok(got > 0, 'audio kept flowing')
  }
  c.stop()
  await ended
  const s = c.getStats()
  const all = rounds.flat()
  const growth = medianSlope(all)
  t.diagnostic(`heapUsed growth: ${growth.toFixed(0)} B/s (${(growth / 1024).toFixed(2)} KB/s) over ${ROUNDS} rounds; ` +
    `noise allowance ${NOISE_BPS} B/s; ${received} packets, ` +
    `gaps ${gaps}, drops ${s.drops}; checksum ${checksum}`)
  assert.equal(bad, 0)
  assert.equal(gaps, 0)
  assert.equal(s.drops, 0)
  assert.ok(growth <= NOISE_BPS, `heapUsed grows ${growth.toFixed(0)} B/s`)
})
