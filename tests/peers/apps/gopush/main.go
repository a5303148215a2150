// Command gopush is a push client for proflow's end-to-end tests: it profiles
// itself with github.com/grafana/pyroscope-go and pushes to -server (Pyroscope's
// /ingest API), which is either a real Pyroscope or proflow's push receiver.
//
// Its CPU goes to the same known hot functions as goscrape: goHotLoop 75%,
// goWarmLoop 25%, about half of one core in all. The split is in work done,
// not in wall time spun: each cycle does -units units of work (a thousand
// multiply-adds each, about 1.7 µs on a 2026 x86 core), three quarters in
// goHotLoop and one quarter in goWarmLoop, so the CPU split is 3:1 however
// busy the machine is (a wall-time spin gets whatever CPU is left, and the
// split drifts with the scheduler).
//
// With -duration it stops after that long, uploading what it profiled last, and
// exits 0; otherwise it runs until killed. Upload errors go to stderr.
package main

import (
	"flag"
	"fmt"
	"log"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/grafana/pyroscope-go"
)

func main() {
	server := flag.String("server", "", "push target base URL, e.g. http://127.0.0.1:4040 (required)")
	app := flag.String("app", "gopush", "application name (becomes service_name)")
	tags := flag.String("tags", "", "extra tags, comma-separated k=v pairs")
	uploadRate := flag.Duration("upload-rate", 5*time.Second, "how often profiles are pushed")
	duration := flag.Duration("duration", 0, "stop after this long (0: run until killed)")
	units := flag.Int("units", 24000, "work units of one cycle, 3/4 in goHotLoop and 1/4 in goWarmLoop (about 40ms of CPU)")
	idle := flag.Duration("idle", 40*time.Millisecond, "sleep after each work cycle")
	flag.Parse()

	if *units < 4 || *units%4 != 0 {
		log.Fatalf("gopush: -units %d must be a positive multiple of 4", *units)
	}
	if u, err := url.Parse(*server); err != nil || u.Host == "" {
		log.Fatalf("gopush: -server %q must be a base URL like http://127.0.0.1:4040", *server)
	}
	tagMap := map[string]string{}
	for _, kv := range strings.Split(*tags, ",") {
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			log.Fatalf("gopush: tag %q is not k=v", kv)
		}
		tagMap[k] = v
	}

	profiler, err := pyroscope.Start(pyroscope.Config{
		ApplicationName: *app,
		ServerAddress:   *server,
		Tags:            tagMap,
		UploadRate:      *uploadRate,
		Logger:          stderrLogger{},
		ProfileTypes: []pyroscope.ProfileType{
			pyroscope.ProfileCPU,
			pyroscope.ProfileAllocObjects,
			pyroscope.ProfileAllocSpace,
			pyroscope.ProfileInuseObjects,
			pyroscope.ProfileInuseSpace,
		},
	})
	if err != nil {
		log.Fatalf("gopush: start profiler: %v", err)
	}

	go work(*units, *idle)
	if *duration <= 0 {
		select {}
	}
	time.Sleep(*duration)
	if err := profiler.Stop(); err != nil {
		log.Fatalf("gopush: stop profiler: %v", err)
	}
}

func work(units int, idle time.Duration) {
	hot, warm := units*3/4, units/4
	for {
		goHotLoop(hot)
		goWarmLoop(warm)
		time.Sleep(idle)
	}
}

var sink uint64

//go:noinline
func goHotLoop(units int) { burn(units) }

//go:noinline
func goWarmLoop(units int) { burn(units) }

// burn does units of a thousand dependent multiply-adds. Whether or not the
// compiler inlines it, every sample taken inside it has goHotLoop or
// goWarmLoop (never inlined) on its stack.
func burn(units int) {
	x := sink
	for u := 0; u < units; u++ {
		for i := 0; i < 1000; i++ {
			x = x*6364136223846793005 + 1442695040888963407
		}
	}
	sink = x
}

// stderrLogger shows the client's errors (a failed upload is what a test wants
// to see) and drops its debug chatter.
type stderrLogger struct{}

func (stderrLogger) Infof(format string, args ...interface{})  {}
func (stderrLogger) Debugf(format string, args ...interface{}) {}
func (stderrLogger) Errorf(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "gopush: "+format+"\n", args...)
}
