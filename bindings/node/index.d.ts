// Types of the zerofan Node.js package (the JavaScript layer in index.js;
// the native layer's generated types are in native.d.ts).
/// <reference types="node" />
import { EventEmitter } from 'node:events'
import type { PoolStats, PoolOptions, NativeClientStats, BrokerStats, LoadOptions, LoadPublisher } from './native'

export type { PoolStats, PoolOptions, NativeClientStats, BrokerStats, LoadOptions, LoadPublisher }

export type QoS = 0 | 1 | 2

export interface UserProperties {
  [key: string]: string | string[]
}

export interface PublishProperties {
  payloadFormatIndicator?: boolean
  messageExpiryInterval?: number
  contentType?: string
  responseTopic?: string
  correlationData?: Buffer
  userProperties?: UserProperties
}

export interface ReceivedProperties extends PublishProperties {
  subscriptionIdentifier?: number | number[]
  topicAlias?: number
}

export interface ClientOptions {
  protocol?: 'mqtt' | 'mqtts' | 'ws' | 'wss' | 'tcp' | 'ssl' | 'tls'
  host?: string
  hostname?: string
  port?: number
  /** WebSocket path (default /mqtt). */
  path?: string
  clientId?: string
  /** 4 (3.1.1) or 5 (default 5). */
  protocolVersion?: 3 | 4 | 5
  clean?: boolean
  /** Seconds (default 60). */
  keepalive?: number
  username?: string
  password?: string | Buffer
  /** Milliseconds between reconnect attempts; 0 turns reconnecting off (default 1000). */
  reconnectPeriod?: number
  /** Milliseconds to wait for CONNACK (default 30000). */
  connectTimeout?: number
  will?: { topic: string; payload?: string | Buffer; qos?: QoS; retain?: boolean }
  properties?: { sessionExpiryInterval?: number; receiveMaximum?: number; maximumPacketSize?: number }
  /** PEM text of trusted CAs (mqtts / wss). Default: Mozilla's roots. */
  ca?: string | Buffer | Array<string | Buffer>
  servername?: string
  rejectUnauthorized?: boolean
  /** Payloads as external Buffers over native pooled memory (default true) or as copies. */
  useExternalBuffer?: boolean
  /** Bytes: a buffer pool of its own for this client with this retention cap. */
  poolSize?: number
  /** Most messages per native-to-JavaScript batch (default 1024). */
  batchSize?: number
  /** Messages the native incoming queue holds before reading pauses (default 1024). */
  incomingCapacity?: number
  maxInflight?: number
  resubscribe?: boolean
}

export interface IClientPublishOptions {
  qos?: QoS
  retain?: boolean
  properties?: PublishProperties
}

export interface IClientSubscribeOptions {
  qos?: QoS
  /** No Local (MQTT 5). */
  nl?: boolean
  /** Retain As Published (MQTT 5). */
  rap?: boolean
  /** Retain Handling 0, 1 or 2 (MQTT 5). */
  rh?: number
}

export interface ISubscriptionGrant {
  topic: string
  /** Granted QoS, or a failure reason code (>= 128). */
  qos: number
}

export interface PublishAck {
  messageId: number
  reasonCode: number
}

export interface IConnackPacket {
  cmd: 'connack'
  sessionPresent: boolean
  returnCode: number
  reasonCode: number
}

export declare class PublishPacket {
  cmd: 'publish'
  topic: string
  payload: Buffer
  qos: QoS
  retain: boolean
  dup: boolean
  properties?: ReceivedProperties
}

export declare class MqttClient extends EventEmitter {
  options: ClientOptions & { clientId?: string }
  connected: boolean
  reconnecting: boolean
  disconnecting: boolean
  disconnected: boolean

  on(event: 'connect', listener: (packet: IConnackPacket) => void): this
  on(event: 'message', listener: (topic: string, payload: Buffer, packet: PublishPacket) => void): this
  on(event: 'error', listener: (error: Error) => void): this
  on(event: 'close' | 'offline' | 'reconnect' | 'end', listener: () => void): this
  on(event: string | symbol, listener: (...args: any[]) => void): this

  publish(topic: string, message: string | Buffer | Uint8Array, opts?: IClientPublishOptions, callback?: (error?: Error | null, ack?: PublishAck) => void): this
  publish(topic: string, message: string | Buffer | Uint8Array, callback?: (error?: Error | null, ack?: PublishAck) => void): this
  publishAsync(topic: string, message: string | Buffer | Uint8Array, opts?: IClientPublishOptions): Promise<PublishAck>

  subscribe(topic: string | string[] | Record<string, IClientSubscribeOptions | QoS>, opts?: IClientSubscribeOptions, callback?: (error: Error | null, granted?: ISubscriptionGrant[]) => void): this
  subscribe(topic: string | string[] | Record<string, IClientSubscribeOptions | QoS>, callback?: (error: Error | null, granted?: ISubscriptionGrant[]) => void): this
  subscribeAsync(topic: string | string[] | Record<string, IClientSubscribeOptions | QoS>, opts?: IClientSubscribeOptions): Promise<ISubscriptionGrant[]>

  unsubscribe(topic: string | string[], opts?: object, callback?: (error?: Error | null) => void): this
  unsubscribe(topic: string | string[], callback?: (error?: Error | null) => void): this
  unsubscribeAsync(topic: string | string[]): Promise<number[]>

  end(force?: boolean, opts?: object, callback?: (error?: Error | null) => void): this
  end(callback?: (error?: Error | null) => void): this
  endAsync(): Promise<void>

  /** Statistics of the buffer pool this client reads into. */
  getPoolStats(): PoolStats
  /** Native counters (null before the first connection). */
  stats(): NativeClientStats | null
}

export declare function connect(url: string, options?: ClientOptions): MqttClient
export declare function connect(options: ClientOptions): MqttClient
/** Resolves once connected; rejects if the first attempt fails. */
export declare function connectAsync(url: string, options?: ClientOptions): Promise<MqttClient>
export declare function connectAsync(options: ClientOptions): Promise<MqttClient>

export interface StartBrokerOptions {
  host?: string
  /** 0 picks a free port (default 1883). */
  port?: number
  /** Directory of the embedded store (created if missing); without it the broker runs in memory. */
  dataDir?: string
  /** Seconds between $SYS/broker/... refreshes for MQTT subscribers (default 1; 0 turns $SYS off). stats() does not depend on it. */
  sysInterval?: number
  maxQueuedMessages?: number
  maxPacketSize?: number
  /** Shards (threads), each with its own event loop and core (default: one per available core; 1 = the single-thread broker). */
  threads?: number
  /** Broker settings in the zerofan binary's TOML format. */
  configToml?: string
}

export declare class Broker {
  readonly port: number
  readonly addresses: string[]
  readonly url: string
  /** Fresh figures from the broker's core (waits for the broker thread, at most a second). */
  stats(): BrokerStats
  /** The figures the broker thread published last (refreshed every half second and on each stats()), without waiting: never blocks. */
  latestStats(): BrokerStats
  close(): Promise<void>
}

export declare function startBroker(options?: StartBrokerOptions): Promise<Broker>

/** Statistics of the pool shared by every client without a poolSize. */
export declare function getPoolStats(): PoolStats
/** Size the shared pool; false if it already exists (a warm-up is still done). */
export declare function configurePool(options: PoolOptions): boolean
/** A native publisher for tests and benchmarks. */
export declare function startLoadPublisher(options: LoadOptions): Promise<LoadPublisher>
// ---- Live audio capture (zerofan-audio) ----

export interface AudioDevice {
  id: string
  host: string
  name: string
  isDefault: boolean
  isLoopback: boolean
  defaultConfig: { sampleRate: number; channels: number; sampleFormat: string } | null
}
/** Capture sources of every audio host (run off the JS thread). */
export declare function listDevices(): Promise<AudioDevice[]>

export interface CaptureOptions {
  /** Device id / name as listDevices() reports it; default device if omitted. */
  device?: string
  sampleRate?: number
  channels?: number
  format?: 'i16' | 'f32'
  /** Packet duration, default 10 ms. */
  packetMs?: number
  /** Default true: Buffers over pooled native memory; false copies. */
  useExternalBuffer?: boolean
  queuePackets?: number
  bufferFrames?: number
  /** Events that may wait for the JS thread (default 256). */
  jsQueue?: number
}
export interface AudioPacketInfo {
  seq: number
  timestampNs: bigint
  sampleRate: number
  channels: number
  format: 'i16' | 'f32'
  frames: number
}
export interface AudioEnd {
  reason: 'stopped' | 'device-lost'
  message: string
}
export interface CaptureStats {
  packets: number
  captured: number
  drops: number
  dropsQueueFull: number
  dropsNoBuffer: number
  dropsSink: number
  frames: number
  callbacks: number
  maxCallbackFrames: number
  errors: number
  xruns: number
  pool: { packets: number; drops: number; hits: number; misses: number; hitRate: number; outstandingBytes: number }
  publish?: { offered: number; dropped: number; published: number; acked: number; failed: number }
}
export declare class AudioCapture extends EventEmitter {
  on(event: 'data', listener: (buffer: Buffer, info: AudioPacketInfo) => void): this
  on(event: 'error', listener: (err: Error & { code: string; fatal: boolean }) => void): this
  on(event: 'end', listener: (end: AudioEnd) => void): this
  on(event: 'start', listener: (params: { sampleRate: number; channels: number; format: string; framesPerPacket: number; device: string }) => void): this
  on(event: string, listener: (...args: any[]) => void): this
  readonly params: { sampleRate: number; channels: number; format: string; framesPerPacket: number; device: string } | null
  /**
   * Asks the capture to stop; `end` follows with reason 'stopped', at the latest 5 s later:
   * when the sound server stops answering, the capture's thread is left to end on its own.
   */
  stop(): this
  getStats(): CaptureStats | null
  /** Streams each packet (32-byte header + samples) to `topic` through the client's native Rust client. */
  publish(client: MqttClient, topic: string, options?: { qos?: 0 | 1 | 2 }): this
}
/** Starts a capture; returns the emitter at once. */
export declare function capture(options?: CaptureOptions): AudioCapture
export declare const native: typeof import('./native')
