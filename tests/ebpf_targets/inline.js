// A target for tests/ebpf_runtimes.rs: two small functions at a 2:1 CPU
// split, called in a loop hot enough that V8's optimizing compiler compiles
// the loop's function with both inlined into it, so their samples land in
// one optimized function's code. Usage: node inline.js SECONDS. Prints
// "ready PID" when it starts spinning and "rounds N" when it ends.
"use strict";

function proflow_inlined_two(s) {
  for (let i = 0; i < 200; i++) s = (s * 31 + (s >>> 7) + i) | 0;
  return s;
}

function proflow_inlined_one(s) {
  for (let i = 0; i < 100; i++) s = (s * 31 + (s >>> 7) + i) | 0;
  return s;
}

function step(s) {
  for (let j = 0; j < 10000; j++) {
    s = proflow_inlined_two(s);
    s = proflow_inlined_one(s);
  }
  return s;
}

function run(seconds) {
  const end = Date.now() + seconds * 1000;
  let rounds = 0;
  let s = 1;
  while (Date.now() < end) {
    s = step(s);
    rounds++;
  }
  return [rounds, s];
}

console.log(`ready ${process.pid}`);
console.log(`rounds ${run(Number(process.argv[2] || 30))[0]}`);
