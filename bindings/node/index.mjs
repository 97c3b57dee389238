// The ES module entry of zerofan: the CommonJS module (index.js) under
// named exports, so that `import` and `require` share one addon and one
// buffer pool.
import zerofan from './index.js'

export const {
  connect,
  connectAsync,
  MqttClient,
  PublishPacket,
  startBroker,
  Broker,
  getPoolStats,
  configurePool,
  startLoadPublisher,
  listDevices,
  capture,
  AudioCapture,
  native
} = zerofan

export default zerofan
