'use strict'
// zerofan for Node.js: an MQTT client shaped like MQTT.js whose received
// payloads are external Buffers over native pooled memory, and the zerofan
// broker embedded in the process. See README.md.
const { EventEmitter } = require('node:events')
const native = require('./lib/native')
const audio = require('./lib/audio')

const DEFAULT_PORTS = { mqtt: 1883, tcp: 1883, mqtts: 8883, ssl: 8883, tls: 8883, ws: 80, wss: 443 }
const SECURE = { mqtts: true, ssl: true, tls: true, wss: true }
// meta's ArrayBuffer index of an empty payload (src/client.rs).
const NO_BUFFER = 0xffffffff

/** A received PUBLISH, with MQTT.js's field names. */
class PublishPacket {
  constructor (topic, payload, flags, properties) {
    this.cmd = 'publish'
    this.topic = topic
    this.payload = payload
    this.qos = flags & 3
    this.retain = (flags & 4) !== 0
    this.dup = (flags & 8) !== 0
    this.properties = properties
  }
}

function pemList (ca) {
  if (ca === undefined || ca === null) return undefined
  const list = Array.isArray(ca) ? ca : [ca]
  return list.map((c) => (typeof c === 'string' ? c : Buffer.from(c).toString('utf8')))
}

function toBufferOrString (v) {
  if (v === undefined || v === null) return Buffer.alloc(0)
  if (typeof v === 'string' || Buffer.isBuffer(v)) return v
  if (ArrayBuffer.isView(v)) return Buffer.from(v.buffer, v.byteOffset, v.byteLength)
  if (v instanceof ArrayBuffer) return Buffer.from(v)
  return String(v)
}

/** Merge a URL and MQTT.js options into the native connect options. */
function resolveOptions (url, opts) {
  const o = { ...(opts || {}) }
  if (url) {
    const u = new URL(url)
    o.protocol = u.protocol.replace(/:$/, '')
    o.hostname = u.hostname.replace(/^\[|\]$/g, '')
    if (u.port) o.port = Number(u.port)
    if (u.pathname && u.pathname !== '/') o.path = u.pathname
    if (u.username && o.username === undefined) o.username = decodeURIComponent(u.username)
    if (u.password && o.password === undefined) o.password = decodeURIComponent(u.password)
  }
  const protocol = (o.protocol || 'mqtt').replace(/:$/, '')
  if (!(protocol in DEFAULT_PORTS)) throw new Error(`zerofan: unsupported protocol ${protocol}`)
  const host = o.hostname || o.host || 'localhost'
  const port = Number(o.port || DEFAULT_PORTS[protocol])
  const secure = SECURE[protocol] === true
  const reconnectPeriod = o.reconnectPeriod === undefined ? 1000 : o.reconnectPeriod
  let will
  if (o.will) {
    will = {
      topic: o.will.topic,
      payload: toBufferOrString(o.will.payload),
      qos: o.will.qos || 0,
      retain: !!o.will.retain
    }
  }
  const props = o.properties || {}
  return {
    resolved: { ...o, protocol, host, port, reconnectPeriod },
    native: {
      protocol,
      host,
      port,
      path: o.path,
      clientId: o.clientId,
      protocolVersion: o.protocolVersion || 5,
      clean: o.clean === undefined ? true : !!o.clean,
      keepalive: o.keepalive === undefined ? 60 : o.keepalive,
      username: o.username,
      password: o.password === undefined ? undefined : toBufferOrString(o.password),
      sessionExpiryInterval: props.sessionExpiryInterval,
      receiveMaximum: props.receiveMaximum,
      maximumPacketSize: props.maximumPacketSize,
      will,
      reconnectPeriod,
      connectTimeout: o.connectTimeout === undefined ? 30000 : o.connectTimeout,
      incomingCapacity: o.incomingCapacity,
      maxInflight: o.maxInflight,
      resubscribe: o.resubscribe,
      ca: secure ? pemList(o.ca) : undefined,
      servername: o.servername,
      rejectUnauthorized: o.rejectUnauthorized === undefined ? true : !!o.rejectUnauthorized,
      useExternalBuffer: o.useExternalBuffer === undefined ? true : !!o.useExternalBuffer,
      poolSize: o.poolSize
    }
  }
}

function normalizeSubscriptions (topic, opts) {
  const base = { qos: 0, ...(opts || {}) }
  const out = []
  const add = (t, o) => out.push({ topic: t, qos: o.qos || 0, nl: o.nl, rap: o.rap, rh: o.rh })
  if (typeof topic === 'string') add(topic, base)
  else if (Array.isArray(topic)) for (const t of topic) add(t, base)
  else if (topic && typeof topic === 'object') {
    for (const t of Object.keys(topic)) {
      const v = topic[t]
      add(t, typeof v === 'number' ? { ...base, qos: v } : { ...base, ...v })
    }
  } else throw new TypeError('zerofan: subscribe needs a topic, an array of topics or an object')
  return out
}

function callbackify (promise, cb) {
  if (typeof cb === 'function') {
    promise.then((v) => cb(null, v), (e) => cb(e))
  } else {
    promise.catch(() => {})
  }
}

/**
 * An MQTT client shaped like MQTT.js's MqttClient. Events: connect,
 * message (topic, payload, packet), error, close, offline, reconnect, end.
 */
class MqttClient extends EventEmitter {
  constructor (url, options) {
    super()
    const { resolved, native: nopts } = resolveOptions(url, options)
    this.options = resolved
    this._nopts = nopts
    this._batchSize = resolved.batchSize || 1024
    this.connected = false
    this.reconnecting = false
    this.disconnecting = false
    this.disconnected = false
    this._native = null
    this._waiters = []
    this._retryTimer = null
    this._connects = 0
    this._losses = 0
    this._closeEmitted = false
    setImmediate(() => this._connect())
  }

  _emitError (err) {
    if (this.listenerCount('error') > 0) this.emit('error', err)
  }

  _connect () {
    if (this.disconnecting) return
    native.connectNative(this._nopts).then(
      async (n) => {
        if (this.disconnecting) {
          await n.end().catch(() => {})
          this._finishEnd()
          return
        }
        const st = await n.nextState(true)
        this._native = n
        this._connects = st.connects
        this._losses = st.losses
        this.options.clientId = n.clientId
        this.connected = true
        this.reconnecting = false
        this._closeEmitted = false
        for (const w of this._waiters.splice(0)) w.resolve(n)
        this.emit('connect', { cmd: 'connack', sessionPresent: !!st.sessionPresent, returnCode: 0, reasonCode: 0 })
        this._pump(n)
        this._watch(n)
      },
      (err) => {
        this._emitError(err)
        this._emitClose()
        if (this.options.reconnectPeriod > 0 && !this.disconnecting) {
          this._retryTimer = setTimeout(() => {
            this._retryTimer = null
            this.reconnecting = true
            this.emit('reconnect')
            this._connect()
          }, this.options.reconnectPeriod)
        } else {
          this.disconnected = true
          for (const w of this._waiters.splice(0)) w.reject(err)
        }
      }
    )
  }

  _emitClose () {
    if (this._closeEmitted) return
    this._closeEmitted = true
    this.connected = false
    this.emit('close')
  }

  // Waits for a batch only when none is ready: after each batch it takes
  // what is queued now synchronously (takeBatch: no trip through the tokio
  // runtime and no wakeup of this thread), and yields to the event loop
  // (setImmediate) before dispatching it, so timers and I/O still run
  // while a stream keeps the queue busy.
  async _pump (n) {
    const max = this._batchSize
    let batch = await n.nextBatch(max)
    for (;;) {
      if (batch === null) return
      this._dispatch(batch)
      batch = n.takeBatch(max)
      if (batch === undefined) batch = await n.nextBatch(max)
      else await new Promise(setImmediate)
    }
  }

  // A batch from nextBatch: [topics, meta, payloads, props] (see
  // src/client.rs): meta holds four u32 per message (flags | topic index
  // << 4, payload offset, payload length, ArrayBuffer index); payloads is
  // an array of external ArrayBuffers, one per pooled read buffer, each
  // payload a Buffer view into one of them (no copy, no napi call per
  // message), or one Buffer of copies to slice.
  _dispatch (batch) {
    const topics = batch[0]
    const meta = batch[1]
    const payloads = batch[2]
    const props = batch[3]
    const m = new Uint32Array(meta.buffer, meta.byteOffset, meta.byteLength >>> 2)
    const n = m.length >>> 2
    const copied = Buffer.isBuffer(payloads)
    let p = 0
    for (let i = 0; i < n; i++) {
      const j = i << 2
      const w = m[j]
      const topic = topics[w >>> 4]
      const off = m[j + 1]
      const len = m[j + 2]
      const ab = m[j + 3]
      const payload = copied
        ? payloads.subarray(off, off + len)
        : ab === NO_BUFFER ? Buffer.alloc(0) : Buffer.from(payloads[ab], off, len)
      let properties
      if (props !== undefined && props[p] === i) {
        properties = props[p + 1]
        p += 2
      }
      try {
        this.emit('message', topic, payload, new PublishPacket(topic, payload, w & 15, properties))
      } catch (e) {
        // A listener threw: report it as Node reports any uncaught error,
        // after the rest of the batch is delivered.
        process.nextTick(() => { throw e })
      }
    }
  }

  async _watch (n) {
    for (;;) {
      let st
      try {
        st = await n.nextState(false)
      } catch {
        return
      }
      if (st.losses > this._losses) {
        this._losses = st.losses
        this.emit('offline')
        this._emitClose()
        if (st.error) this._emitError(new Error(st.error))
        if (st.state !== 'closed' && !this.disconnecting) {
          this.reconnecting = true
          this.emit('reconnect')
        }
      }
      if (st.connects > this._connects) {
        this._connects = st.connects
        this.connected = true
        this.reconnecting = false
        this._closeEmitted = false
        this.emit('connect', { cmd: 'connack', sessionPresent: !!st.sessionPresent, returnCode: 0, reasonCode: 0 })
      }
      if (st.state === 'closed') {
        this.reconnecting = false
        this._emitClose()
        if (!this.disconnecting) this.disconnected = true
        return
      }
    }
  }

  _ready () {
    if (this._native) return Promise.resolve(this._native)
    if (this.disconnecting || this.disconnected) return Promise.reject(new Error('client disconnecting'))
    return new Promise((resolve, reject) => this._waiters.push({ resolve, reject }))
  }

  /** publish(topic, message, [options], [callback]) */
  publish (topic, message, opts, callback) {
    if (typeof opts === 'function') {
      callback = opts
      opts = undefined
    }
    callbackify(this.publishAsync(topic, message, opts), callback)
    return this
  }

  publishAsync (topic, message, opts) {
    const o = opts || {}
    if (this.disconnecting) return Promise.reject(new Error('client disconnecting'))
    const payload = toBufferOrString(message)
    const n = this._native
    const send = (c) =>
      c.publish(topic, payload, o.qos || 0, !!o.retain, o.properties ? publishProperties(o.properties) : undefined)
    return n ? send(n) : this._ready().then(send)
  }

  /** subscribe(topic | topic[] | {topic: opts}, [options], [callback]) */
  subscribe (topic, opts, callback) {
    if (typeof opts === 'function') {
      callback = opts
      opts = undefined
    }
    callbackify(this.subscribeAsync(topic, opts), callback)
    return this
  }

  subscribeAsync (topic, opts) {
    let subs
    try {
      subs = normalizeSubscriptions(topic, opts)
    } catch (e) {
      return Promise.reject(e)
    }
    return this._ready()
      .then((n) => n.subscribe(subs))
      .then((codes) => subs.map((s, i) => ({ topic: s.topic, qos: codes[i] === undefined ? 128 : codes[i] })))
  }

  unsubscribe (topic, opts, callback) {
    if (typeof opts === 'function') {
      callback = opts
      opts = undefined
    }
    callbackify(this.unsubscribeAsync(topic, opts), callback)
    return this
  }

  unsubscribeAsync (topic) {
    const topics = Array.isArray(topic) ? topic : [topic]
    return this._ready().then((n) => n.unsubscribe(topics))
  }

  /** end([force], [options], [callback]) */
  end (force, opts, callback) {
    if (typeof force === 'function') {
      callback = force
      force = false
    } else if (typeof opts === 'function') {
      callback = opts
    }
    callbackify(this.endAsync(), callback)
    return this
  }

  endAsync () {
    if (this._ending) return this._ending
    this.disconnecting = true
    if (this._retryTimer) {
      clearTimeout(this._retryTimer)
      this._retryTimer = null
    }
    const n = this._native
    this._ending = (n ? n.end().catch(() => {}) : Promise.resolve()).then(() => this._finishEnd())
    return this._ending
  }

  _finishEnd () {
    if (this.disconnected) return
    this.disconnected = true
    this.reconnecting = false
    for (const w of this._waiters.splice(0)) w.reject(new Error('client disconnecting'))
    this._emitClose()
    this.emit('end')
  }

  /** Statistics of the buffer pool this client reads into. */
  getPoolStats () {
    return this._native ? this._native.poolStats() : native.getPoolStats()
  }

  /** Native counters: connects, losses, messages, bytes. */
  stats () {
    return this._native ? this._native.stats() : null
  }
}

function publishProperties (p) {
  const out = {
    payloadFormatIndicator: p.payloadFormatIndicator,
    messageExpiryInterval: p.messageExpiryInterval,
    contentType: p.contentType,
    responseTopic: p.responseTopic,
    correlationData: p.correlationData === undefined ? undefined : Buffer.from(p.correlationData)
  }
  if (p.userProperties) {
    const pairs = []
    for (const k of Object.keys(p.userProperties)) {
      const v = p.userProperties[k]
      for (const x of Array.isArray(v) ? v : [v]) pairs.push([k, String(x)])
    }
    out.userProperties = pairs
  }
  return out
}

/** connect(url, [options]) or connect(options), as MQTT.js. */
function connect (url, options) {
  if (url && typeof url === 'object') {
    options = url
    url = undefined
  }
  return new MqttClient(url, options)
}

/** Like connect, resolving once connected (rejects on the first failure). */
function connectAsync (url, options) {
  if (url && typeof url === 'object') {
    options = url
    url = undefined
  }
  const client = new MqttClient(url, { ...(options || {}), reconnectPeriod: 0, ...(options && options.reconnectPeriod !== undefined ? { reconnectPeriod: options.reconnectPeriod } : {}) })
  return new Promise((resolve, reject) => {
    const onConnect = () => {
      client.removeListener('close', onClose)
      resolve(client)
    }
    const onClose = () => {
      if (client.reconnecting || client._retryTimer) return
      client.removeListener('connect', onConnect)
      reject(client._lastError || new Error('connection failed'))
    }
    client.once('connect', onConnect)
    client.on('error', (e) => { client._lastError = e })
    client.on('close', onClose)
  })
}

/** An embedded broker: the zerofan broker running in this process. */
class Broker {
  constructor (n) {
    this._native = n
    this.port = n.port
    this.addresses = n.addresses
  }

  get url () {
    return `mqtt://127.0.0.1:${this.port}`
  }

  stats () {
    return this._native.stats()
  }

  /** The figures the broker published last (at most half a second old), without waiting for it. */
  latestStats () {
    return this._native.latestStats()
  }

  close () {
    if (!this._closing) this._closing = this._native.close()
    return this._closing
  }
}

/** startBroker({ host, port, dataDir, ... }) -> Promise<Broker> */
async function startBroker (options) {
  const o = options || {}
  const n = await native.startBrokerNative({
    host: o.host,
    port: o.port,
    dataDir: o.dataDir,
    sysInterval: o.sysInterval,
    maxQueuedMessages: o.maxQueuedMessages,
    maxPacketSize: o.maxPacketSize,
    threads: o.threads,
    configToml: o.configToml
  })
  return new Broker(n)
}

module.exports = {
  connect,
  connectAsync,
  MqttClient,
  PublishPacket,
  startBroker,
  Broker,
  getPoolStats: native.getPoolStats,
  configurePool: native.configurePool,
  startLoadPublisher: native.startLoadPublisher,
  listDevices: audio.listDevices,
  capture: audio.capture,
  AudioCapture: audio.AudioCapture,
  native
}
