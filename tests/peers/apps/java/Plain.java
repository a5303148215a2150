// A small Java program for the JDK's own Flight Recorder (no agent): for the
// given number of seconds it burns CPU in plainHot and plainWarm, about 2:1,
// and allocates in plainAlloc on a second thread.
// Usage: java -XX:StartFlightRecording=filename=F,settings=profile Plain.java SECONDS
public class Plain {
    static volatile long sink;

    static long spin(long nanos) {
        long end = System.nanoTime() + nanos;
        long x = 0;
        while (System.nanoTime() < end) {
            for (int i = 0; i < 1000; i++) {
                x = x * 31 + i;
            }
        }
        return x;
    }

    static void plainHot() {
        sink += spin(20_000_000);
    }

    static void plainWarm() {
        sink += spin(10_000_000);
    }

    static void plainAlloc(long end) {
        byte[][] keep = new byte[64][];
        int i = 0;
        while (System.currentTimeMillis() < end) {
            keep[i++ % keep.length] = new byte[64 * 1024];
            sink += keep.length;
            try {
                Thread.sleep(1);
            } catch (InterruptedException e) {
                return;
            }
        }
    }

    public static void main(String[] args) throws Exception {
        long end = System.currentTimeMillis() + Long.parseLong(args[0]) * 1000;
        Thread alloc = new Thread(() -> plainAlloc(end), "alloc");
        alloc.start();
        while (System.currentTimeMillis() < end) {
            plainHot();
            plainWarm();
        }
        alloc.join();
        System.out.println("done " + sink);
    }
}
