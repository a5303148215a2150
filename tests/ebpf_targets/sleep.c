/* A target for tests/ebpf_runtimes.rs: waits in two known functions at a 2:1 split of
 * time, for the ebpf receiver's off-CPU profile. It prints "ready PID",
 * waits in proflow_wait_for_profiler for SIGUSR1 (sent once the profiler
 * runs), then for SECONDS sleeps 20 ms in proflow_sleep_two and 10 ms in
 * proflow_sleep_one, in turn, and prints "slept TWO_NS ONE_NS": the time each
 * spent in nanosleep, measured around the calls. Built without frame
 * pointers: the stacks of waits are unwound from .eh_frame too.
 * Usage: sleep SECONDS. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static volatile unsigned long calls;

static unsigned long long now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (unsigned long long)t.tv_sec * 1000000000ULL + (unsigned long long)t.tv_nsec;
}

__attribute__((noinline)) unsigned long long proflow_nap(long ms)
{
	struct timespec d = {0, ms * 1000000L};
	unsigned long long start = now_ns();
	nanosleep(&d, NULL);
	calls++;
	return now_ns() - start;
}

__attribute__((noinline)) unsigned long long proflow_sleep_two(void)
{
	unsigned long long ns = proflow_nap(20);
	calls++;
	return ns;
}

__attribute__((noinline)) unsigned long long proflow_sleep_one(void)
{
	unsigned long long ns = proflow_nap(10);
	calls++;
	return ns;
}

__attribute__((noinline)) void proflow_wait_for_profiler(void)
{
	sigset_t set;
	int sig;
	sigemptyset(&set);
	sigaddset(&set, SIGUSR1);
	sigprocmask(SIG_BLOCK, &set, NULL);
	printf("ready %d\n", (int)getpid());
	fflush(stdout);
	sigwait(&set, &sig);
	calls++;
}

__attribute__((noinline)) void run(long seconds)
{
	unsigned long long two = 0, one = 0;
	unsigned long long end = now_ns() + (unsigned long long)seconds * 1000000000ULL;
	while (now_ns() < end) {
		two += proflow_sleep_two();
		one += proflow_sleep_one();
	}
	printf("slept %llu %llu\n", two, one);
	fflush(stdout);
}

int main(int argc, char **argv)
{
	long seconds = argc > 1 ? atol(argv[1]) : 3;
	proflow_wait_for_profiler();
	run(seconds);
	return calls == 0;
}
