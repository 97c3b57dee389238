'use strict'
// Live audio capture (zerofan-audio) as an EventEmitter, and publishing of
// the stream to an MQTT topic through a zerofan client's native client.
const { EventEmitter } = require('node:events')
const native = require('./native')

/** The capture sources of every audio host, with their default formats. */
function listDevices () {
  return native.listAudioDevices()
}

function toError (e) {
  return Object.assign(new Error(e.message), { code: e.code, fatal: e.fatal })
}

class AudioCapture extends EventEmitter {
  constructor (options) {
    super()
    const o = options || {}
    this._native = null
    this._stopRequested = false
    this._ended = false
    this._pendingPublish = []
    this._lastStats = null
    const onEvent = (kind, a, b) => {
      if (kind === 'data') {
        this.emit('data', a, b)
      } else if (kind === 'error') {
        if (!a.fatal && this.listenerCount('error') === 0) return
        this.emit('error', toError(a))
      } else if (kind === 'end') {
        this._finish(a)
      }
    }
    native
      .captureNative(
        {
          device: o.device == null ? undefined : String(o.device),
          sampleRate: o.sampleRate,
          channels: o.channels,
          format: o.format || 'i16',
          packetMs: o.packetMs == null ? 10 : o.packetMs,
          useExternalBuffer: o.useExternalBuffer !== false,
          queuePackets: o.queuePackets,
          bufferFrames: o.bufferFrames,
          jsQueue: o.jsQueue
        },
        onEvent
      )
      .then(
        (n) => {
          this._native = n
          for (const p of this._pendingPublish) this._startPublish(p)
          this._pendingPublish = []
          if (this._stopRequested) n.stop()
          else this.emit('start', n.params)
        },
        (err) => {
          const e = err instanceof Error ? err : new Error(String(err))
          if (e.code === undefined) e.code = 'StartFailed'
          e.fatal = true
          if (this.listenerCount('error') > 0) this.emit('error', e)
          this._finish({ reason: 'device-lost', message: e.message })
        }
      )
  }

  _finish (info) {
    if (this._ended) return
    this._ended = true
    if (this._native) {
      // The capture thread sent its last event: drop the device stream now,
      // not when V8 collects the native object.
      this._native.release()
      this._lastStats = this._native.stats()
    }
    this.emit('end', info)
  }

  /** The parameters the capture runs with, once started (else null). */
  get params () {
    return this._native ? this._native.params : null
  }

  /**
   * Asks the capture to stop; `end` follows with reason 'stopped', at the
   * latest STOP_TIMEOUT (5 s) later (a sound server that stopped answering
   * keeps the capture thread, not `end`, waiting).
   */
  stop () {
    this._stopRequested = true
    if (this._native) this._native.stop()
    return this
  }

  /** Packets, drops, pool use (and publish counters when publishing). */
  getStats () {
    if (this._native) return this._native.stats()
    return this._lastStats
  }

  /**
   * Streams the packets (32-byte header + samples) to `topic` with the
   * Rust client inside `client` (a zerofan MqttClient, connected or about
   * to be). Returns this emitter.
   */
  publish (client, topic, opts) {
    const p = { client, topic, qos: (opts && opts.qos) || 0 }
    if (this._native) this._startPublish(p)
    else this._pendingPublish.push(p)
    return this
  }

  _startPublish ({ client, topic, qos }) {
    const go = (n) => {
      if (this._ended) return
      this._native.publish(n, topic, qos)
    }
    const fail = (err) => {
      if (this.listenerCount('error') > 0) this.emit('error', err)
    }
    if (client && client._native) {
      try {
        go(client._native)
      } catch (err) {
        fail(err)
      }
    } else if (client && typeof client._ready === 'function') {
      client._ready().then(go).catch(fail)
    } else {
      fail(new TypeError('publish: expected a zerofan client'))
    }
  }
}

/** Starts capturing; returns the emitter at once (see AudioCapture). */
function capture (options) {
  return new AudioCapture(options)
}

module.exports = { listDevices, capture, AudioCapture }
