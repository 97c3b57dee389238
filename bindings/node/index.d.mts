// Types of zerofan's ES module entry (index.mjs): the same as index.d.ts.
import * as zerofan from './index.js'

export * from './index.js'
export default zerofan
