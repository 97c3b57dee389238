// How the heap tests measure heapUsed growth per second.
//
// heapUsed is sampled after a full collection once a second while the
// stream runs. Even then it moves on its own, in steps and spikes that have
// nothing to do with the stream: V8 compiles code and flushes bytecode, and
// the test runner keeps bookkeeping in old space. In a 240 s run of captured
// audio (24,000 packets) old space after collection wandered between +29
// and +152 KB with no trend, and code space grew by 52 KB in total.
//
// So the growth of a test is the Theil-Sen slope (the median of the slopes
// of every pair of samples) over the samples of all its measured rounds
// together, 48 in 45 s: samples that land on a spike move the median very
// little, where they moved a least-squares slope of one 15 s round by
// several KB/s (single rounds measured from -11 to +10 KB/s).
// Leaking one small object per message (>= 64 B at 100 messages/s, so
// >= 6.4 KB/s) is a steady slope over the whole run, which the median
// keeps.
import v8 from 'node:v8'
import { fullGc, sleep } from '../helpers.mjs'

/** The allowance for heapUsed growth: 4 KB/s (60 KB per 15 s round). */
export const NOISE_BPS = 4096

/**
 * Samples heapUsed after a full collection every second for `seconds`;
 * returns [[seconds (performance.now() / 1000), heapUsed], ...] and the
 * change per V8 heap space from the first sample to the last (for the
 * report). Rounds' samples concatenated are one series in time.
 */
export async function sampleHeap (seconds) {
  await fullGc()
  const s0 = spaces()
  const t0 = performance.now()
  const samples = [[t0 / 1000, process.memoryUsage().heapUsed]]
  for (let i = 1; i <= seconds; i++) {
    await sleep(Math.max(0, t0 + i * 1000 - performance.now()))
    await fullGc()
    samples.push([performance.now() / 1000, process.memoryUsage().heapUsed])
  }
  return { samples, spaces: spaceDelta(s0, spaces()) }
}

/** The Theil-Sen slope of [x, y] points: the median of pairwise slopes. */
export function medianSlope (points) {
  const slopes = []
  for (let i = 0; i < points.length; i++) {
    for (let j = i + 1; j < points.length; j++) {
      const dx = points[j][0] - points[i][0]
      if (dx > 0) slopes.push((points[j][1] - points[i][1]) / dx)
    }
  }
  if (slopes.length === 0) return 0
  slopes.sort((a, b) => a - b)
  const m = slopes.length >> 1
  return slopes.length % 2 ? slopes[m] : (slopes[m - 1] + slopes[m]) / 2
}

/** Samples as a short list of KB relative to `base`, for the report. */
export function sampleList (samples, base) {
  return samples.map(([, y]) => ((y - base) / 1024).toFixed(0)).join(' ')
}

export function kb (b) {
  return `${(b / 1024).toFixed(2)} KB`
}

function spaces () {
  return Object.fromEntries(v8.getHeapSpaceStatistics().map((s) => [s.space_name.replace('_space', ''), s.space_used_size]))
}

function spaceDelta (a, b) {
  return Object.keys(b).map((k) => `${k} ${((b[k] - a[k]) / 1024).toFixed(1)}`).filter((x) => !x.endsWith(' 0.0')).join(', ')
}
