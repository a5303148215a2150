'use strict';
// A Node program profiled by the real @pyroscope/nodejs client, for proflow's
// end-to-end tests.
//
// It burns CPU for SECONDS seconds in two functions with a known split:
//   nodeHotLoop  -- 75% of the work
//   nodeWarmLoop -- 25% of the work
// The split is in work done, not in wall time spun: each slice does a fixed
// number of work units in each function, 3:1, so the CPU split is 3:1 however
// busy the machine is (a wall-time spin gets whatever CPU is left, and the
// split drifts with the scheduler).
// and pushes wall-clock profiles with CPU time collected (sample types
// samples/count, wall/nanoseconds, cpu/nanoseconds) to a Pyroscope-compatible
// server, then stops the client (which uploads the last, partial profile) and
// exits.
//
// Usage: node main.js [--server URL] [--app-name NAME] [--upload-interval S] SECONDS
// Defaults come from the environment: PYROSCOPE_SERVER (else
// http://127.0.0.1:4040), PYROSCOPE_APP_NAME (else proflow-node-peer).
// The client uploads every --upload-interval seconds (default 1; the
// client's own default is 60) and once more on stop. The work runs in short
// slices that yield to the event loop, otherwise the client's upload timer
// could never fire.

// The wall/heap start and stop functions live on the default export only.
const Pyroscope = require('@pyroscope/nodejs').default;

// Work units of one slice: 3:1, about 2.4 ms and 0.8 ms of CPU on a 2026 x86 core.
// A slice much shorter than the 10 ms between samples, and not a divisor of
// it, so the samples do not keep hitting the same phase of the slices.
const HOT_UNITS = 1500;
const WARM_UNITS = 500;

function parseArgs(argv) {
  const args = {
    server: process.env.PYROSCOPE_SERVER || 'http://127.0.0.1:4040',
    appName: process.env.PYROSCOPE_APP_NAME || 'proflow-node-peer',
    uploadInterval: 1,
    seconds: undefined,
  };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const value = () => {
      if (i + 1 >= argv.length) throw new Error(`${a} needs a value`);
      return argv[++i];
    };
    if (a === '--server') args.server = value();
    else if (a === '--app-name') args.appName = value();
    else if (a === '--upload-interval') args.uploadInterval = Number(value());
    else if (args.seconds === undefined) args.seconds = Number(a);
    else throw new Error(`unexpected argument ${a}`);
  }
  if (!(args.seconds > 0)) throw new Error('usage: node main.js [--server URL] [--app-name NAME] [--upload-interval S] SECONDS');
  if (!(args.uploadInterval > 0)) throw new Error('--upload-interval must be a positive number of seconds');
  return args;
}

// Does `units` units of a thousand multiply-adds; returns a value so the work is not optimised away.
function burn(units) {
  let acc = 0;
  for (let u = 0; u < units; u++) {
    for (let i = 0; i < 1000; i++) acc = (Math.imul(acc, 31) + i) | 0;
  }
  return acc;
}

function nodeHotLoop(units) {
  return burn(units);
}

function nodeWarmLoop(units) {
  return burn(units);
}

async function main() {
  const args = parseArgs(process.argv.slice(2));
  Pyroscope.init({
    serverAddress: args.server,
    appName: args.appName,
    flushIntervalMs: args.uploadInterval * 1000,
    tags: { peer: 'node' },
    wall: { collectCpuTime: true },
  });
  Pyroscope.startWallProfiling();

  const deadline = performance.now() + args.seconds * 1000;
  let acc = 0;
  while (performance.now() < deadline) {
    acc ^= nodeHotLoop(HOT_UNITS);
    acc ^= nodeWarmLoop(WARM_UNITS);
    // Let the client's upload timer and HTTP requests run.
    await new Promise((resolve) => setImmediate(resolve));
  }

  await Pyroscope.stopWallProfiling();
  console.log(`done app=${args.appName} server=${args.server} seconds=${args.seconds} acc=${acc}`);
}

main().then(
  () => process.exit(0),
  (err) => {
    console.error(err && err.stack ? err.stack : String(err));
    process.exit(1);
  },
);
