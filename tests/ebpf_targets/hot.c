/* A target for tests/ebpf.rs and scripts/bench-ebpf: two hot functions at a
 * 2:1 CPU split. One round is proflow_spin(2N) in proflow_hot_two, then
 * proflow_spin(N) in proflow_hot_one. Every call is followed by a write, so
 * no call becomes a tail jump and every frame is on the stack:
 * main -> run -> proflow_hot_{two,one} -> proflow_spin.
 * Each round's length is random (1 to 8 units, the same for both functions),
 * so a fixed sampling rate cannot lock onto the loop's period and see one
 * function more than its share. 
 * Usage: hot SECONDS (0: until killed). Prints "ready PID" when it starts
 * spinning and "rounds N" when it ends. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define N 50000UL

static volatile unsigned long sink;
static volatile unsigned long calls;

__attribute__((noinline)) void proflow_spin(unsigned long n)
{
	for (unsigned long i = 0; i < n; i++)
		sink += i;
	calls++;
}

__attribute__((noinline)) void proflow_hot_two(unsigned long k)
{
	proflow_spin(2 * k * N);
	calls++;
}

__attribute__((noinline)) void proflow_hot_one(unsigned long k)
{
	proflow_spin(k * N);
	calls++;
}

__attribute__((noinline)) unsigned long run(long seconds)
{
	struct timespec now, end;
	unsigned long rounds = 0;
	unsigned long x = 88172645463325252UL; /* xorshift64 */

	clock_gettime(CLOCK_MONOTONIC, &end);
	end.tv_sec += seconds;
	for (;;) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		proflow_hot_two(1 + (x & 7));
		proflow_hot_one(1 + (x & 7));
		rounds++;
		if (seconds > 0 && (rounds & 15) == 0) {
			clock_gettime(CLOCK_MONOTONIC, &now);
			if (now.tv_sec > end.tv_sec ||
			    (now.tv_sec == end.tv_sec && now.tv_nsec >= end.tv_nsec))
				break;
		}
	}
	calls++;
	return rounds;
}

int main(int argc, char **argv)
{
	long seconds = argc > 1 ? atol(argv[1]) : 0;
	printf("ready %d\n", (int)getpid());
	fflush(stdout);
	unsigned long rounds = run(seconds);
	printf("rounds %lu\n", rounds);
	return 0;
}
