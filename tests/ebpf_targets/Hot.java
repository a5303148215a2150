// A target for tests/ebpf_runtimes.rs: two hot methods at a 2:1 CPU split, run by the
// JVM; `jcmd PID Compiler.perfmap` then names their compiled code in
// /tmp/perf-PID.map. Each round's length is random (1 to 8 units, the same
// for both methods). Usage: java Hot.java SECONDS. Prints "ready PID" when it
// starts spinning and "rounds N" when it ends.
import java.util.concurrent.ThreadLocalRandom;

public class Hot {
    static final long N = 2_000_000L;
    static volatile long sink;

    static void proflow_hot_two(long k) {
        long s = 0;
        for (long i = 0; i < 2 * k * N; i++) s += i ^ (s >>> 3);
        sink += s;
    }

    static void proflow_hot_one(long k) {
        long s = 0;
        for (long i = 0; i < k * N; i++) s += i ^ (s >>> 3);
        sink += s;
    }

    static long run(long seconds) {
        long end = System.nanoTime() + seconds * 1_000_000_000L;
        long rounds = 0;
        while (System.nanoTime() < end) {
            long k = ThreadLocalRandom.current().nextLong(1, 9);
            proflow_hot_two(k);
            proflow_hot_one(k);
            rounds++;
        }
        return rounds;
    }

    public static void main(String[] args) {
        System.out.println("ready " + ProcessHandle.current().pid());
        System.out.println("rounds " + run(args.length > 0 ? Long.parseLong(args[0]) : 30));
    }
}
