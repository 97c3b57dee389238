// Live audio capture through the Node API (zerofan-audio), on Linux with a
// throwaway PulseAudio session (test/pulse.mjs): a 440 Hz tone played into
// a null sink, captured from its monitor through ALSA's pulse PCM.
import test from 'node:test'
import assert from 'node:assert/strict'
import { zf, sleep, until } from './helpers.mjs'
import { startPulse, dominantFrequency, samplesOf } from './pulse.mjs'

// ALSA's pulse PCM (source from PULSE_SOURCE): steady 10 ms delivery.
const DEVICE = process.env.ZF_AUDIO_DEVICE || 'alsa:pulse'
const HEADER_LEN = 32

// Packets per second by the stream clock over the last 100 of `ts`.
function lastRate (ts) {
  const n = ts.length
  return n < 101 ? 0 : 100 / (Number(ts[n - 1] - ts[n - 101]) / 1e9)
}

test.before(async () => {
  await startPulse()
  // Warm-up: the null sink only runs once the tone reaches it, and the
  // first seconds of a fresh server can stall (once, in a CI rehearsal on
  // 2026-11-30, at 70 packets/s just after 2 s of audio); wait for 2 s of
  // audio whose last second came at the device's rate.
  const c = zf.capture({ device: DEVICE, sampleRate: 48000, channels: 1 })
  const ts = []
  c.on('error', () => {})
  c.on('data', (buf, info) => ts.push(info.timestampNs))
  const ended = new Promise((resolve) => c.on('end', resolve))
  const steady = () => ts.length >= 200 && Math.abs(lastRate(ts) - 100) < 1
  try {
    await until(steady, 20000, 'warm-up: steady audio from the PulseAudio monitor')
  } finally {
    c.stop()
    await ended
  }
})

async function captureFor (ms, opts) {
  const c = zf.capture({ device: DEVICE, sampleRate: 48000, ...opts })
  const packets = []
  const errors = []
  c.on('error', (e) => errors.push(e))
  c.on('data', (buf, info) => packets.push({ buf, info }))
  const ended = new Promise((resolve) => c.on('end', resolve))
  await new Promise((resolve, reject) => {
    c.once('start', resolve)
    c.once('end', (e) => reject(new Error(`capture ended before starting: ${e.message} ${errors.map(String)}`)))
  })
  await sleep(ms)
  c.stop()
  const end = await ended
  return { c, packets, errors, end, stats: c.getStats() }
}

function checkStream ({ packets, errors, end, stats }, { channels, format }) {
  assert.deepEqual(errors, [])
  assert.equal(end.reason, 'stopped')
  assert.ok(packets.length > 50, `packets: ${packets.length}`)
  const bytes = 480 * channels * (format === 'i16' ? 2 : 4)
  const first = packets[0].info.seq
  packets.forEach(({ buf, info }, i) => {
    assert.equal(info.seq, first + i, 'seq must be consecutive')
    assert.equal(buf.length, bytes, 'packet size')
    assert.equal(info.frames, 480)
    assert.equal(info.sampleRate, 48000)
    assert.equal(info.channels, channels)
    assert.equal(info.format, format)
    assert.equal(typeof info.timestampNs, 'bigint')
  })
  // Packet rate by the stream clock, first to last.
  const t0 = packets[0].info.timestampNs
  const t1 = packets[packets.length - 1].info.timestampNs
  const rate = (packets.length - 1) / (Number(t1 - t0) / 1e9)
  // Dominant frequency over the last second.
  const x = packets.slice(-100).flatMap(({ buf }) => samplesOf(buf, format, channels))
  const freq = dominantFrequency(x, 48000)
  console.log(`# ${format} x${channels}: ${packets.length} packets of ${bytes} B, ${rate.toFixed(2)} packets/s, ` +
    `dominant ${freq} Hz, drops ${stats.drops} (sink ${stats.dropsSink}), pool hit rate ${stats.pool.hitRate.toFixed(3)}`)
  assert.ok(Math.abs(freq - 440) <= 2, `dominant frequency ${freq}`)
  assert.ok(rate > 98 && rate < 102, `packets per second ${rate}`)
  assert.equal(stats.drops, 0, `no drops: ${JSON.stringify(stats)}`)
  assert.equal(stats.dropsSink, 0)
  assert.equal(stats.errors, 0)
  assert.ok(stats.pool.hitRate > 0.9, `pool hit rate ${stats.pool.hitRate}`)
}

test('capture i16 mono: 440 Hz, 960-byte packets at 100/s, no drops (external buffers)', async () => {
  checkStream(await captureFor(3000, { channels: 1, format: 'i16' }), { channels: 1, format: 'i16' })
})

test('a bad device: error then end', async () => {
  const c = zf.capture({ device: 'no-such-device-zf' })
  const events = []
  c.on('error', (e) => events.push(['error', e]))
  await new Promise((resolve) => c.on('end', (e) => { events.push(['end', e]); resolve() }))
  assert.deepEqual(events.map((e) => e[0]), ['error', 'end'])
  assert.ok(events[0][1] instanceof Error)
  assert.equal(events[0][1].fatal, true)
})

test('published through zerofan to 10 subscribers: complete and in order', async () => {
  const broker = await zf.startBroker({ host: '127.0.0.1', port: 0 })
  const url = `mqtt://127.0.0.1:${broker.port}`
  const subs = []
  try {
    for (let i = 0; i < 10; i++) {
      const s = await zf.connectAsync(url)
      await s.subscribeAsync('audio/live', { qos: 0 })
      const got = []
      s.on('message', (topic, payload) => got.push({ seq: Number(payload.readBigUInt64LE(16)), len: payload.length, magic: payload.toString('latin1', 0, 4) }))
      subs.push({ s, got })
    }
    const pubClient = await zf.connectAsync(url)
    const c = zf.capture({ device: DEVICE, sampleRate: 48000, channels: 1, format: 'i16' })
    const seqs = []
    c.on('data', (buf, info) => seqs.push(info.seq))
    c.publish(pubClient, 'audio/live', { qos: 0 })
    const ended = new Promise((resolve) => c.on('end', resolve))
    await new Promise((resolve) => c.once('start', resolve))
    await sleep(3000)
    c.stop()
    await ended
    const stats = c.getStats()
    await until(() => subs.every(({ got }) => got.length >= stats.publish.offered), 10000, 'all subscribers got every packet')
    assert.equal(stats.drops, 0)
    assert.equal(stats.publish.dropped, 0)
    assert.equal(stats.publish.failed, 0)
    assert.ok(stats.publish.offered >= 100, `offered ${stats.publish.offered}`)
    for (const { got } of subs) {
      assert.equal(got.length, stats.publish.offered)
      const first = got[0].seq
      got.forEach((m, i) => {
        assert.equal(m.magic, 'ZFAU')
        assert.equal(m.seq, first + i, 'in order, no gap')
        assert.equal(m.len, HEADER_LEN + 960)
      })
    }
    console.log(`# fan-out: ${stats.publish.offered} packets x 10 subscribers, complete and in order; JS saw ${seqs.length}`)
    await pubClient.endAsync()
  } finally {
    for (const { s } of subs) await s.endAsync()
    await broker.close()
  }
})

test('listDevices lists the PulseAudio monitor with its default format', async () => {
  const devs = await zf.listDevices()
  const mon = devs.find((d) => d.id === 'pulseaudio:zf_null.monitor')
  assert.ok(mon, `monitor not listed: ${devs.map((d) => d.id)}`)
  assert.equal(mon.isLoopback, true)
  assert.deepEqual([mon.defaultConfig.sampleRate, mon.defaultConfig.channels], [48000, 1])
})
