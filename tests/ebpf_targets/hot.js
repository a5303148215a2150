// A target for tests/ebpf_runtimes.rs: two hot functions at a 2:1 CPU split, run by
// Node with --perf-basic-prof so their JIT code is named in
// /tmp/perf-PID.map. Each round's length is random (1 to 8 units, the same
// for both functions). Usage: node --perf-basic-prof hot.js SECONDS.
// Prints "ready PID" when it has spun half a second and "rounds N" when it ends.
"use strict";
const N = 2000000;
let sink = 0;

function proflow_hot_two(k) {
  let s = 0;
  for (let i = 0; i < 2 * k * N; i++) s += i;
  sink += s;
}

function proflow_hot_one(k) {
  let s = 0;
  for (let i = 0; i < k * N; i++) s += i;
  sink += s;
}

function run(seconds) {
  const end = Date.now() + seconds * 1000;
  let rounds = 0;
  while (Date.now() < end) {
    const k = 1 + Math.floor(Math.random() * 8);
    proflow_hot_two(k);
    proflow_hot_one(k);
    rounds++;
  }
  return rounds;
}

// Half a second first, so both functions are compiled by the optimizing
// tier (named `JS:*`) before anyone samples.
run(0.5);
console.log(`ready ${process.pid}`);
console.log(`rounds ${run(Number(process.argv[2] || 30))} ${sink > 0}`);
