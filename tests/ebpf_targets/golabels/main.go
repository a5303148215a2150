// A target for tests/ebpf_runtimes.rs: the 2:1 split of hot.c in Go, each hot
// function run under pprof labels of its own (runtime/pprof.Do, as the Go
// OpenTelemetry profiling bridges set span_id), with no profiling client:
// hotTwo under span_id 00000000000000aa, route /two and a 32-character
// trace_id, hotOne under span_id 00000000000000bb and a note of 150 bytes
// (longer than the receiver keeps).
// Usage: hot SECONDS (0: until killed); prints "ready PID", then "rounds N".
package main

import (
	"context"
	"fmt"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"
)

const n = 50000

var sink uint64

//go:noinline
func spin(k uint64) uint64 {
	var acc uint64
	for i := uint64(0); i < k; i++ {
		acc += i ^ sink
	}
	return acc
}

//go:noinline
func hotTwo(k uint64) uint64 { return spin(2*k*n) ^ 1 }

//go:noinline
func hotOne(k uint64) uint64 { return spin(k*n) ^ 2 }

func main() {
	seconds := 0
	if len(os.Args) > 1 {
		seconds, _ = strconv.Atoi(os.Args[1])
	}
	fmt.Printf("ready %d\n", os.Getpid())
	end := time.Now().Add(time.Duration(seconds) * time.Second)
	ctx := context.Background()
	two := pprof.Labels("span_id", "00000000000000aa", "route", "/two",
		"trace_id", "0123456789abcdef0123456789abcdef")
	one := pprof.Labels("span_id", "00000000000000bb", "note", strings.Repeat("x", 150))
	rounds := 0
	// Random round lengths (as hot.c): no locking onto the sampling rate.
	x := uint64(88172645463325252)
	for {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		k := 1 + x&7
		pprof.Do(ctx, two, func(context.Context) { sink ^= hotTwo(k) })
		pprof.Do(ctx, one, func(context.Context) { sink ^= hotOne(k) })
		rounds++
		if seconds > 0 && rounds%16 == 0 && time.Now().After(end) {
			break
		}
	}
	fmt.Printf("rounds %d\n", rounds)
}
