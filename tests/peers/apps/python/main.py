"""A Python program profiled by the real pyroscope-io client, for proflow's end-to-end tests.

It burns CPU for SECONDS seconds in two functions with a known split:

* ``py_hot_loop``  -- 75% of the work
* ``py_warm_loop`` -- 25% of the work

The split is in work done, not in wall time spun: each round does a fixed
number of work units in each function, 3:1, so the CPU split is 3:1 however
busy the machine is (a wall-time spin gets whatever CPU is left, and the
split drifts with the scheduler).

and pushes its profiles to a Pyroscope-compatible server, then shuts the agent
down (which sends the last, partial profile) and exits.

Usage::

    python main.py [--server URL] [--app-name NAME] [--upload-interval S] SECONDS

Defaults come from the environment: ``PYROSCOPE_SERVER`` (else
http://127.0.0.1:4040), ``PYROSCOPE_APP_NAME`` (else proflow-python-peer).
The client uploads every ``--upload-interval`` seconds (default 1, the
client's own default is 10) and once more on shutdown, so even a one-second
run pushes at least once. Exit status is non-zero when the agent could not be
started or shut down.
"""

import argparse
import os
import sys
import time

import pyroscope

# Work units of one round: 3:1, about 2.2 ms and 0.7 ms of CPU on a 2026 x86 core.
# A round much shorter than the 10 ms between samples, and not a divisor of
# it, so the samples do not keep hitting the same phase of the rounds.
HOT_UNITS = 150
WARM_UNITS = 50


def burn(units):
    """Does `units` units of a hundred multiply-adds; returns a value so nothing is optimised away."""
    acc = 0
    for _ in range(units):
        for i in range(100):
            acc = (acc * 31 + i) & 0xFFFFFFFF
    return acc


def py_hot_loop(units):
    return burn(units)


def py_warm_loop(units):
    return burn(units)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("seconds", type=float, help="how long to burn CPU")
    parser.add_argument("--server", default=os.environ.get("PYROSCOPE_SERVER", "http://127.0.0.1:4040"))
    parser.add_argument("--app-name", default=os.environ.get("PYROSCOPE_APP_NAME", "proflow-python-peer"))
    parser.add_argument("--upload-interval", type=int, default=1, help="seconds between uploads")
    args = parser.parse_args(argv)

    started = pyroscope.configure(
        application_name=args.app_name,
        server_address=args.server,
        upload_interval=args.upload_interval,
        sample_rate=100,
        tags={"peer": "python"},
        enable_logging=os.environ.get("PYROSCOPE_LOG") == "1",
    )
    if started is False:
        print("pyroscope.configure failed", file=sys.stderr)
        return 2

    deadline = time.perf_counter() + args.seconds
    acc = 0
    while time.perf_counter() < deadline:
        acc ^= py_hot_loop(HOT_UNITS)
        acc ^= py_warm_loop(WARM_UNITS)

    if not pyroscope.shutdown():
        print("pyroscope.shutdown failed", file=sys.stderr)
        return 3
    print(f"done app={args.app_name} server={args.server} seconds={args.seconds} acc={acc}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
