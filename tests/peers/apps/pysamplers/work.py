"""A fixed amount of work split 2:1 between two functions, for the
sampler of tests/ingest_formats_cases/producers.rs to record: py_hot does two units of
work for each unit py_warm does. The number of rounds is the first
argument (default 300)."""

import sys


def unit():
    total = 0
    for i in range(20000):
        total += i * i
    return total


def py_hot():
    unit()
    unit()


def py_warm():
    unit()


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    for _ in range(rounds):
        py_hot()
        py_warm()


if __name__ == "__main__":
    main()
