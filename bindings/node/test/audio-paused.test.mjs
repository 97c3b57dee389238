// A sound server that stops answering must not keep `end` (nor the event
// loop) waiting: cpal's PulseAudio stream waits for the server when it is
// dropped, so past STOP_TIMEOUT (5 s) a watchdog sends `end` itself.
// Its own file (its own process and PulseAudio session, test/pulse.mjs):
// it pauses that server with SIGSTOP.
import test from 'node:test'
import assert from 'node:assert/strict'
import { execFileSync } from 'node:child_process'
import { zf, until } from './helpers.mjs'
import { startPulse, MONITOR } from './pulse.mjs'

function signalServer (signal) {
  const sock = process.env.PULSE_SERVER.replace(/^unix:/, '')
  execFileSync('pkill', [`-${signal}`, '-f', `socket=${sock}`])
}

test('stop with the sound server paused: end comes within the stop timeout', async () => {
  await startPulse()
  // cpal's PulseAudio host, whose stream waits on the server when dropped.
  const c = zf.capture({ device: `pulseaudio:${MONITOR}`, sampleRate: 48000, channels: 1 })
  let packets = 0
  c.on('error', () => {})
  c.on('data', () => { packets++ })
  const ended = new Promise((resolve) => c.on('end', resolve))
  await until(() => packets >= 10, 20000, 'packets from the PulseAudio monitor')
  signalServer('STOP')
  try {
    // Let the stream's next timing request go out unanswered.
    await new Promise((resolve) => setTimeout(resolve, 1500))
    const t0 = Date.now()
    c.stop()
    const timeout = new Promise((resolve, reject) => {
      setTimeout(() => reject(new Error('no end within 15 s of stop')), 15000).unref()
    })
    const end = await Promise.race([ended, timeout])
    const took = Date.now() - t0
    console.log(`# end after ${took} ms: ${end.reason} ${end.message}`)
    assert.equal(end.reason, 'stopped')
    assert.ok(took < 15000)
  } finally {
    signalServer('CONT')
  }
})
