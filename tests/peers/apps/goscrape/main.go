// Command goscrape is a scrape target for proflow's end-to-end tests: a Go
// program with two known hot functions that serves net/http/pprof.
//
// goHotLoop burns about 75% of the program's CPU time and goWarmLoop about 25%,
// so a CPU profile scraped from /debug/pprof/profile has both names at a known
// ratio. Each work cycle also sleeps, so the program uses about half of one core.
//
// It listens on -addr (127.0.0.1 only; port 0 picks a free port) and prints
// GOSCRAPE_ENDPOINT=host:port on stdout once it accepts connections.
package main

import (
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	_ "net/http/pprof" // registers /debug/pprof/* on http.DefaultServeMux
	"os"
	"runtime"
	"time"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "listen address (loopback only)")
	cycle := flag.Duration("cycle", 40*time.Millisecond, "CPU time of one work cycle (3/4 hot, 1/4 warm)")
	idle := flag.Duration("idle", 40*time.Millisecond, "sleep after each work cycle")
	flag.Parse()

	host, _, err := net.SplitHostPort(*addr)
	if err != nil || !net.ParseIP(host).IsLoopback() {
		log.Fatalf("goscrape: -addr %q must be a loopback host:port", *addr)
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatalf("goscrape: listen: %v", err)
	}
	runtime.SetBlockProfileRate(1)
	runtime.SetMutexProfileFraction(1)
	go work(*cycle, *idle)
	fmt.Printf("GOSCRAPE_ENDPOINT=%s\n", ln.Addr())
	os.Stdout.Sync()
	log.Fatal(http.Serve(ln, nil))
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
