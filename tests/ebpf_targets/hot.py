"""A target for tests/ebpf_runtimes.rs: two hot functions at a 2:1 CPU split, run by
every CPython from 3.8 to 3.13 as it is (the receiver walks the interpreter's
frames), and by 3.12+ with -X perf (each Python function's trampoline is
named in /tmp/perf-PID.map). Each round's length is random (1 to 8 units, the
same for both functions). Usage: python3 [-X perf] hot.py SECONDS [thread]
(thread: the functions run in a thread of their own, a second, idle thread
is started after it, and the main thread waits for the first). Prints "ready PID" when it starts spinning and "rounds N" when it
ends."""
import os
import random
import sys
import threading
import time

N = 20000


def proflow_hot_two(k):
    s = 0
    for i in range(2 * k * N):
        s += i
    return s


def proflow_hot_one(k):
    s = 0
    for i in range(k * N):
        s += i
    return s


def run(seconds):
    end = time.monotonic() + seconds
    rounds = 0
    while time.monotonic() < end:
        k = random.randint(1, 8)
        proflow_hot_two(k)
        proflow_hot_one(k)
        rounds += 1
    return rounds


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 30
    print(f"ready {os.getpid()}", flush=True)
    if sys.argv[2:] == ["thread"]:
        done = []
        worker = threading.Thread(target=lambda: done.append(run(seconds)))
        worker.start()
        # A thread started after the worker, idle: its state is the first
        # of the interpreter's list, so the worker's must be found by its
        # thread id, not taken as the first.
        idle = threading.Thread(target=time.sleep, args=(seconds,), daemon=True)
        idle.start()
        worker.join()
        print(f"rounds {done[0]}", flush=True)
    else:
        print(f"rounds {run(seconds)}", flush=True)


main()
