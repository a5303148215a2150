// A small Java service for the JFR tests, run with the Pyroscope Java agent
// (io.pyroscope:agent, from Maven Central) on the classpath and as
// -javaagent. For the given number of seconds it:
//   - burns CPU in javaHot and javaWarm, 2:1 in work done, on the main thread, each
//     call under a dynamic label (endpoint=/hot, endpoint=/warm);
//   - allocates in javaAlloc on a second thread;
//   - contends for one monitor in javaContend on two more threads.
// Usage: java -javaagent:AGENT -cp AGENT App.java SECONDS
import io.pyroscope.labels.v2.LabelsSet;
import io.pyroscope.labels.v2.Pyroscope;

public class App {
    static final Object MONITOR = new Object();
    static volatile long sink;

    /**
     * Burns a fixed amount of CPU: `units` of a thousand multiply-adds
     * (about a millisecond per thousand units on a 2026 x86 core). Work, not wall time: on a
     * busy machine a wall-time spin gets whatever CPU the scheduler and the
     * garbage collector leave it, and the 2:1 split drifts with them.
     */
    static long work(long units) {
        long x = 0;
        for (long u = 0; u < units; u++) {
            for (int i = 0; i < 1000; i++) {
                x = x * 31 + i;
            }
        }
        return x;
    }

    static void javaHot() {
        sink += work(20_000);
    }

    static void javaWarm() {
        sink += work(10_000);
    }

    static void javaAlloc(long end) {
        byte[][] keep = new byte[64][];
        int i = 0;
        while (System.currentTimeMillis() < end) {
            keep[i++ % keep.length] = new byte[256 * 1024];
            sink += keep.length;
            try {
                Thread.sleep(1);
            } catch (InterruptedException e) {
                return;
            }
        }
    }

    static void javaContend(long end) {
        while (System.currentTimeMillis() < end) {
            synchronized (MONITOR) {
                try {
                    Thread.sleep(5);
                } catch (InterruptedException e) {
                    return;
                }
            }
        }
    }

    public static void main(String[] args) throws Exception {
        long seconds = Long.parseLong(args[0]);
        long end = System.currentTimeMillis() + seconds * 1000;
        Thread alloc = new Thread(() -> javaAlloc(end), "alloc");
        Thread lockA = new Thread(() -> javaContend(end), "contend-a");
        Thread lockB = new Thread(() -> javaContend(end), "contend-b");
        alloc.start();
        lockA.start();
        lockB.start();
        LabelsSet hot = new LabelsSet("endpoint", "/hot");
        LabelsSet warm = new LabelsSet("endpoint", "/warm");
        while (System.currentTimeMillis() < end) {
            Pyroscope.LabelsWrapper.run(hot, App::javaHot);
            Pyroscope.LabelsWrapper.run(warm, App::javaWarm);
        }
        alloc.join();
        lockA.join();
        lockB.join();
        System.out.println("done " + sink);
    }
}
