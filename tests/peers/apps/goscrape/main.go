// Command goscrape is a scrape target for proflow's end-to-end tests and the
// scrape benchmark: a Go program with known functions that serves
// net/http/pprof.
//
// What it does, and what its profiles therefore show:
//
//   - CPU: goHotLoop burns about 75% of the program's CPU time and goWarmLoop
//     about 25%, so a CPU profile scraped from /debug/pprof/profile has both
//     names at a known ratio (3:1). Each work cycle also sleeps, so the program
//     uses about half of one core. Everything below is light on CPU (wakeups a
//     few hundred times a second) and leaves the ratio at about 3:1.
//   - Allocations: goAllocLoop allocates -alloc-rate bytes per second (default
//     4 MiB/s) in 64 KiB chunks (one every 15.6 ms at the default), keeping the
//     last 8 in a ring so they are real heap allocations. Go samples
//     allocations (runtime.MemProfileRate, by default one sample per 512 KiB)
//     and scales the sampled values up, so the alloc_space of goAllocLoop's
//     stacks in the difference of two /debug/pprof/allocs answers is
//     approximately alloc-rate × the time between them: 60 MiB for 15 s at
//     the default. About one 64 KiB chunk in nine is sampled, so over 15 s
//     that is about 110 samples and the total scatters by roughly ±10% (one
//     standard deviation); -mem-profile-rate 1 records every allocation and
//     makes it exact. The heap profile is published at the end of each GC
//     cycle; at 4 MiB/s a cycle ends about every second, so a profile lags
//     the allocations by about a second. Serving scrapes allocates too, under
//     other stacks.
//   - Mutex: two goroutines in goMutexContend take turns on one sync.Mutex,
//     each holding it for -mutex-hold (default 10ms, asleep) and resting half
//     as long, so the other one always waits: about 100 contentions a second
//     with about 0.5 s of delay per second, recorded under goMutexContend
//     (Go records the delay at Unlock, with the unlocker's stack). The waits
//     in Lock also appear in the block profile under goMutexContend.
//   - Block: goBlockWait receives from an unbuffered channel that another
//     goroutine sends on every -block-period (default 10ms): about 100 events
//     a second and about 1 s of delay per second under goBlockWait.
//
// Mutex and block profiling record every event (rates set to 1).
//
// Beside net/http/pprof it serves what Grafana's and Felix Geisendörfer's
// libraries add to a Go program, on the -addr listener only:
//
//   - godeltaprof (github.com/grafana/pyroscope-go/godeltaprof/http/pprof):
//     /debug/pprof/delta_heap, delta_mutex and delta_block answer the
//     allocations, mutex and block profiles as deltas: each answer holds
//     what happened since the previous request to the same path (the first
//     one: since the program started). goAllocLoop's alloc_space in one of
//     them is therefore about -alloc-rate × the time since the previous
//     request, not since start. Profile times are when the answer was
//     written; the duration is how long writing took.
//   - fgprof (github.com/felixge/fgprof): /debug/fgprof?seconds=N samples
//     every goroutine's stack 99 times a second for N seconds, running or
//     waiting, as wall-clock time ("time", nanoseconds; "samples", count).
//     A goroutine that lives throughout has about N seconds under its
//     stack: goAllocLoop, goBlockWait and work (goHotLoop, goWarmLoop)
//     one each, goMutexContend two (N×2), whatever they are doing.
//
// It listens on -addr (127.0.0.1 only; port 0 picks a free port) and prints
// GOSCRAPE_ENDPOINT=host:port on stdout once it accepts connections.
//
// Virtual targets (the scale benchmark, scripts/bench-scrape): -virtual N
// listens on N more loopback ports (each port 0, so the kernel picks them)
// and serves the same /debug/pprof/ endpoints on each. Go allows one CPU
// profile at a time, so with -virtual a background goroutine profiles the
// CPU continuously, -virtual-cpu-seconds (default 14s, the seconds Alloy asks
// for at its default 15s interval) per profile, and /debug/pprof/profile on
// every listener, -addr's included, answers with the latest completed one.
// The request's ?seconds= (default 30, as net/http/pprof) only sets how long
// the answer waits: a scraper holds a connection open for as long as with a
// real CPU profile, so the connection counts of a benchmark are realistic.
// Until the first background profile completes, answers wait for it.
// allocs, heap, goroutine, mutex, block and threadcreate are answered from
// copies at most -virtual-cache old (default 1s; each copy is made by the
// first request that finds the last one too old). The real handlers (with
// -virtual-cache 0) fail at a thousand targets because of the goroutine
// profile: Go takes one at a time, each walks every goroutine (one per open
// connection), and each request waiting its turn already holds a buffer
// for all their stacks. Measured with 1,000 targets each asked for these
// four and a 14 s CPU profile every 15 s by curl, goscrape on one core: real
// handlers 87% of the core, 1.6 GB RSS and 17% of the requests (nearly all
// goroutine ones) over curl's 30 s limit; copies 50% (34% idle, most of it
// the hot and warm loops), 0.3 GB, every request answered. cmdline and
// symbol are the real handlers. /debug/pprof/trace is not served (one trace
// at a time, as for the CPU profile).
//
// With -targets-file PATH the N virtual endpoints (not -addr) are written to
// PATH in Prometheus file_sd JSON,
// [{"targets":["127.0.0.1:p1",...],"labels":{}}], atomically (a temporary
// file renamed over PATH) once every listener is accepting, before
// GOSCRAPE_ENDPOINT is printed.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"runtime"
	rpprof "runtime/pprof"
	"strconv"
	"sync"
	"time"

	"github.com/felixge/fgprof"
	deltapprof "github.com/grafana/pyroscope-go/godeltaprof/http/pprof"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "listen address (loopback only)")
	cycle := flag.Duration("cycle", 40*time.Millisecond, "CPU time of one work cycle (3/4 hot, 1/4 warm)")
	idle := flag.Duration("idle", 40*time.Millisecond, "sleep after each work cycle")
	allocRate := flag.Int64("alloc-rate", 4<<20, "bytes per second goAllocLoop allocates, in 64 KiB chunks (0: off)")
	memRate := flag.Int("mem-profile-rate", 0, "runtime.MemProfileRate: bytes per allocation sample (0: keep Go's default, 512 KiB; 1: every allocation)")
	mutexHold := flag.Duration("mutex-hold", 10*time.Millisecond, "how long goMutexContend holds the contended mutex (0: off)")
	blockPeriod := flag.Duration("block-period", 10*time.Millisecond, "how long goBlockWait waits for each channel receive (0: off)")
	virtual := flag.Int("virtual", 0, "serve the pprof endpoints on this many more loopback ports")
	virtualCPU := flag.Duration("virtual-cpu-seconds", 14*time.Second, "with -virtual: length of each background CPU profile")
	virtualCache := flag.Duration("virtual-cache", time.Second, "with -virtual: answer the non-CPU profiles from copies at most this old (0: the real handlers)")
	targetsFile := flag.String("targets-file", "", "with -virtual: write the virtual endpoints here as Prometheus file_sd JSON")
	flag.Parse()

	// Before anything allocates much: the rate applies to later allocations.
	if *memRate > 0 {
		runtime.MemProfileRate = *memRate
	}
	host, _, err := net.SplitHostPort(*addr)
	if err != nil || !net.ParseIP(host).IsLoopback() {
		log.Fatalf("goscrape: -addr %q must be a loopback host:port", *addr)
	}
	if *virtual < 0 || (*virtual > 0 && *virtualCPU < time.Second) {
		log.Fatalf("goscrape: -virtual must be >= 0 and -virtual-cpu-seconds >= 1s")
	}
	if *targetsFile != "" && *virtual == 0 {
		log.Fatalf("goscrape: -targets-file needs -virtual")
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatalf("goscrape: listen: %v", err)
	}
	runtime.SetBlockProfileRate(1)
	runtime.SetMutexProfileFraction(1)
	go work(*cycle, *idle)
	if *allocRate > 0 {
		go goAllocLoop(*allocRate)
	}
	if *mutexHold > 0 {
		var mu sync.Mutex
		go goMutexContend(&mu, *mutexHold)
		go goMutexContend(&mu, *mutexHold)
	}
	if *blockPeriod > 0 {
		ch := make(chan struct{})
		go blockSender(ch, *blockPeriod)
		go goBlockWait(ch)
	}

	if *virtual == 0 {
		fmt.Printf("GOSCRAPE_ENDPOINT=%s\n", ln.Addr())
		os.Stdout.Sync()
		log.Fatal(http.Serve(ln, realMux()))
	}

	cpu := newCPUCache(*virtualCPU)
	go cpu.run()
	mux := virtualMux(cpu, *virtualCache)
	// One server for every listener: each Serve call runs its own accept loop.
	srv := &http.Server{Handler: mux}
	targets := make([]string, 0, *virtual)
	lns := make([]net.Listener, 0, *virtual)
	for i := 0; i < *virtual; i++ {
		l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			log.Fatalf("goscrape: virtual listener %d of %d: %v", i+1, *virtual, err)
		}
		lns = append(lns, l)
		targets = append(targets, l.Addr().String())
	}
	errs := make(chan error, 1)
	for _, l := range append(lns, ln) {
		go func(l net.Listener) {
			if err := srv.Serve(l); err != nil {
				select {
				case errs <- err:
				default:
				}
			}
		}(l)
	}
	// A bound, listening socket takes connections into its backlog at once,
	// so every target is reachable from here on.
	if *targetsFile != "" {
		if err := writeTargets(*targetsFile, targets); err != nil {
			log.Fatalf("goscrape: -targets-file: %v", err)
		}
	}
	fmt.Printf("GOSCRAPE_ENDPOINT=%s\n", ln.Addr())
	os.Stdout.Sync()
	log.Fatal(<-errs)
}

// realMux serves net/http/pprof as a program that imports it does, plus
// godeltaprof's and fgprof's endpoints. The virtual listeners do not serve
// those: godeltaprof keeps one previous profile per path for the whole
// process, so targets sharing it would split each other's deltas.
func realMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.HandleFunc("/debug/pprof/delta_heap", deltapprof.Heap)
	mux.HandleFunc("/debug/pprof/delta_mutex", deltapprof.Mutex)
	mux.HandleFunc("/debug/pprof/delta_block", deltapprof.Block)
	mux.Handle("/debug/fgprof", fgprof.Handler())
	return mux
}

// virtualMux serves the CPU profile from cpu, trace not at all, and the
// other profiles from the real handlers or, with cacheFor > 0, from copies.
func virtualMux(cpu *cpuCache, cacheFor time.Duration) *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.Handle("/debug/pprof/profile", cpu)
	mux.Handle("/debug/pprof/trace", http.NotFoundHandler())
	if cacheFor > 0 {
		for _, name := range []string{"allocs", "heap", "goroutine", "mutex", "block", "threadcreate"} {
			mux.Handle("/debug/pprof/"+name, &profileCache{name: name, maxAge: cacheFor})
		}
	}
	return mux
}

// cpuCache takes CPU profiles back to back and keeps the latest completed one.
type cpuCache struct {
	period time.Duration
	mu     sync.Mutex
	latest []byte
	ready  chan struct{} // closed when the first profile completed
}

func newCPUCache(period time.Duration) *cpuCache {
	return &cpuCache{period: period, ready: make(chan struct{})}
}

func (c *cpuCache) run() {
	for first := true; ; first = false {
		var buf bytes.Buffer
		if err := rpprof.StartCPUProfile(&buf); err != nil {
			log.Fatalf("goscrape: background CPU profile: %v", err)
		}
		time.Sleep(c.period)
		rpprof.StopCPUProfile()
		c.mu.Lock()
		c.latest = buf.Bytes()
		c.mu.Unlock()
		if first {
			close(c.ready)
		}
	}
}

// ServeHTTP waits as long as the real handler would (?seconds=, default 30),
// then answers with the latest completed profile.
func (c *cpuCache) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	sec, err := strconv.ParseInt(r.FormValue("seconds"), 10, 64)
	if sec <= 0 || err != nil {
		sec = 30
	}
	t := time.NewTimer(time.Duration(sec) * time.Second)
	defer t.Stop()
	select {
	case <-t.C:
	case <-r.Context().Done():
		return
	}
	select {
	case <-c.ready:
	case <-r.Context().Done():
		return
	}
	c.mu.Lock()
	p := c.latest
	c.mu.Unlock()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", `attachment; filename="profile"`)
	w.Write(p)
}

// profileCache answers one named profile (debug=0, gzipped pprof) from a copy
// renewed when a request finds it older than maxAge.
type profileCache struct {
	name   string
	maxAge time.Duration
	mu     sync.Mutex
	at     time.Time
	data   []byte
}

func (c *profileCache) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	if c.data == nil || time.Since(c.at) > c.maxAge {
		var buf bytes.Buffer
		if err := rpprof.Lookup(c.name).WriteTo(&buf, 0); err != nil {
			c.mu.Unlock()
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		c.data, c.at = buf.Bytes(), time.Now()
	}
	p := c.data
	c.mu.Unlock()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", fmt.Sprintf(`attachment; filename=%q`, c.name))
	w.Write(p)
}

// writeTargets writes one file_sd target group to path, through a temporary
// file in the same directory so a reader never sees it half written.
func writeTargets(path string, targets []string) error {
	group := []struct {
		Targets []string          `json:"targets"`
		Labels  map[string]string `json:"labels"`
	}{{Targets: targets, Labels: map[string]string{}}}
	data, err := json.Marshal(group)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // fails harmlessly once renamed
	if _, err := tmp.Write(append(data, '\n')); err != nil {
		tmp.Close()
		return err
	}
	// CreateTemp makes it 0600; a scraper running as another user reads it.
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

func work(cycle, idle time.Duration) {
	hot, warm := cycle*3/4, cycle/4
	for {
		goHotLoop(hot)
		goWarmLoop(warm)
		time.Sleep(idle)
	}
}

var sink uint64

//go:noinline
func goHotLoop(d time.Duration) { spin(d) }

//go:noinline
func goWarmLoop(d time.Duration) { spin(d) }

// spin busy-loops for d. Whether or not the compiler inlines it, every sample
// taken inside it has goHotLoop or goWarmLoop (never inlined) on its stack.
func spin(d time.Duration) {
	end := time.Now().Add(d)
	x := sink
	for time.Now().Before(end) {
		for i := 0; i < 1000; i++ {
			x = x*6364136223846793005 + 1442695040888963407
		}
	}
	sink = x
}

const allocChunk = 64 << 10

// allocRing keeps the last chunks reachable: stored in a global, they escape
// to the heap and cannot be optimised away, and they die a few chunks later.
var allocRing [8][]byte

// goAllocLoop allocates rate bytes per second in allocChunk pieces. It paces
// by the clock (chunks due since the start) rather than by counting sleeps,
// so a late wakeup is made up at once and the long-run rate is exact.
//
//go:noinline
func goAllocLoop(rate int64) {
	period := time.Duration(float64(allocChunk) / float64(rate) * float64(time.Second))
	start := time.Now()
	var done int64
	for {
		due := int64(time.Since(start).Seconds() * float64(rate) / allocChunk)
		for ; done < due; done++ {
			b := make([]byte, allocChunk)
			b[0] = byte(done) // the chunk is used, not just made
			allocRing[done%int64(len(allocRing))] = b
		}
		time.Sleep(period)
	}
}

// goMutexContend takes mu, holds it for hold while asleep (no CPU), lets go
// and rests hold/2. Two of these on one mutex alternate, each arriving while
// the other holds it, so every round has one contention of about hold/2.
//
//go:noinline
func goMutexContend(mu *sync.Mutex, hold time.Duration) {
	for {
		mu.Lock()
		time.Sleep(hold)
		mu.Unlock()
		time.Sleep(hold / 2)
	}
}

// blockSender sends on ch every period; goBlockWait is waiting each time, so
// the send itself never blocks and only the receive is in the block profile.
func blockSender(ch chan<- struct{}, period time.Duration) {
	for {
		time.Sleep(period)
		ch <- struct{}{}
	}
}

// goBlockWait receives from ch forever, blocked about a period each time.
//
//go:noinline
func goBlockWait(ch <-chan struct{}) {
	for range ch {
	}
}
