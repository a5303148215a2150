// Command gopush is a push client for proflow's end-to-end tests: it profiles
// itself with github.com/grafana/pyroscope-go and pushes to -server (Pyroscope's
// /ingest API), which is either a real Pyroscope or proflow's push receiver.
//
// Its CPU goes to the same known hot functions as goscrape: goHotLoop about 75%,
// goWarmLoop about 25%, about half of one core in all.
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
	cycle := flag.Duration("cycle", 40*time.Millisecond, "CPU time of one work cycle (3/4 hot, 1/4 warm)")
	idle := flag.Duration("idle", 40*time.Millisecond, "sleep after each work cycle")
	flag.Parse()

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

	go work(*cycle, *idle)
	if *duration <= 0 {
		select {}
	}
	time.Sleep(*duration)
	if err := profiler.Stop(); err != nil {
		log.Fatalf("gopush: stop profiler: %v", err)
	}
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

// stderrLogger shows the client's errors (a failed upload is what a test wants
// to see) and drops its debug chatter.
type stderrLogger struct{}

func (stderrLogger) Infof(format string, args ...interface{})  {}
func (stderrLogger) Debugf(format string, args ...interface{}) {}
func (stderrLogger) Errorf(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "gopush: "+format+"\n", args...)
}
