"""A Python program profiled by the real pyroscope-io client, for proflow's end-to-end tests.

It burns CPU for SECONDS seconds in two functions with a known split:

* ``py_hot_loop``  -- about 75% of the CPU time
* ``py_warm_loop`` -- about 25% of the CPU time

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

# One slice of the work loop; 75% of it in the hot function, 25% in the warm one.
SLICE_SECONDS = 0.02
HOT_SHARE = 0.75


def spin(seconds):
    """Busy-loops on the CPU for `seconds` of wall time; returns a value so nothing is optimised away."""
    deadline = time.perf_counter() + seconds
    acc = 0
    while time.perf_counter() < deadline:
        for i in range(200):
            acc = (acc * 31 + i) & 0xFFFFFFFF
    return acc


def py_hot_loop(seconds):
    return spin(seconds)


def py_warm_loop(seconds):
    return spin(seconds)


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
        acc ^= py_hot_loop(SLICE_SECONDS * HOT_SHARE)
        acc ^= py_warm_loop(SLICE_SECONDS * (1 - HOT_SHARE))

    if not pyroscope.shutdown():
        print("pyroscope.shutdown failed", file=sys.stderr)
        return 3
    print(f"done app={args.app_name} server={args.server} seconds={args.seconds} acc={acc}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
