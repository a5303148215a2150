// A target for tests/ebpf_runtimes.rs: two small methods at a 2:1 CPU split,
// called in a loop hot enough that the JIT compiles the loop's method with
// both inlined into it, so their samples land in one compiled method's code.
// Usage: java Inline.java SECONDS. Prints "ready PID" when it starts
// spinning and "rounds N" when it ends.
public class Inline {
    static volatile long sink;

    static long proflow_inlined_two(long s) {
        for (int i = 0; i < 200; i++) s = s * 31 + (s >>> 7) + i;
        return s;
    }

    static long proflow_inlined_one(long s) {
        for (int i = 0; i < 100; i++) s = s * 31 + (s >>> 7) + i;
        return s;
    }

    static long run(long seconds) {
        long end = System.nanoTime() + seconds * 1_000_000_000L;
        long rounds = 0;
        long s = 1;
        while (System.nanoTime() < end) {
            for (int j = 0; j < 10_000; j++) {
                s = proflow_inlined_two(s);
                s = proflow_inlined_one(s);
            }
            rounds++;
        }
        sink = s;
        return rounds;
    }

    public static void main(String[] args) {
        System.out.println("ready " + ProcessHandle.current().pid());
        System.out.println("rounds " + run(args.length > 0 ? Long.parseLong(args[0]) : 30));
    }
}
