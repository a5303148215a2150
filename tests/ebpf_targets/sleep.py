"""A target for tests/ebpf_runtimes.rs: waits in two Python functions at a 2:1 split
of time, for the ebpf receiver's off-CPU profile with Python frames. It prints
"ready PID" and waits for SIGUSR1 (sent once the profiler runs); then sleeps
5 ms at a time in proflow_warm_up until a second SIGUSR1 (sent once the
profiler's output shows those waits with their Python frames: it knows this
process); then for SECONDS sleeps 20 ms in proflow_sleep_two and 10 ms in
proflow_sleep_one, in turn, and prints "slept TWO_NS ONE_NS": the time each
spent in time.sleep, measured around the calls. Usage: python3 sleep.py SECONDS."""
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


def proflow_warm_up():
    time.sleep(0.005)


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 3
    # Blocked, the signals wait as pending until asked for: none is missed.
    usr1 = {signal.SIGUSR1}
    signal.pthread_sigmask(signal.SIG_BLOCK, usr1)
    print(f"ready {os.getpid()}", flush=True)
    signal.sigwait(usr1)
    # Short waits until told that the profiler walks this process's frames.
    while signal.SIGUSR1 not in signal.sigpending():
        proflow_warm_up()
    signal.sigwait(usr1)
    two = one = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        two += proflow_sleep_two()
        one += proflow_sleep_one()
    print(f"slept {two} {one}", flush=True)


main()
