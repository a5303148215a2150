"""A target for tests/ebpf_runtimes.rs: waits in two Python functions at a 2:1 split
of time, for the ebpf receiver's off-CPU profile with Python frames. It prints
"ready PID", waits for SIGUSR1 (sent once the profiler runs), then for SECONDS
sleeps 20 ms in proflow_sleep_two and 10 ms in proflow_sleep_one, in turn, and
prints "slept TWO_NS ONE_NS": the time each spent in time.sleep, measured
around the calls. Before it waits for the signal it sleeps 5 ms 20 times, so
the profiler knows it by then. Usage: python3 sleep.py SECONDS."""
import os
import signal
import sys
import time


def proflow_sleep_two():
    start = time.monotonic_ns()
    time.sleep(0.020)
    return time.monotonic_ns() - start


def proflow_sleep_one():
    start = time.monotonic_ns()
    time.sleep(0.010)
    return time.monotonic_ns() - start


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 3
    signal.signal(signal.SIGUSR1, lambda *_: None)
    print(f"ready {os.getpid()}", flush=True)
    # Short waits first, so the profiler knows this process (and walks its
    # Python frames) before the measured ones.
    for _ in range(20):
        time.sleep(0.005)
    signal.pause()
    two = one = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        two += proflow_sleep_two()
        one += proflow_sleep_one()
    print(f"slept {two} {one}", flush=True)


main()
