// gootlpold sends one request of OTLP profiles in the 1.9 layout (the
// layout of opentelemetry-proto v1.9.0, through the project's own Go
// bindings of that release), as producers released before 1.10 send it:
// a CPU profile of three stacks, whose samples carry values, attribute
// indexes and a link. It posts the request to the OTLP/HTTP URL given and
// prints, as JSON, the stacks it sent (root first, ";"-joined) with their
// values, and the attribute and link each one carried.
//
//	gootlpold http://127.0.0.1:4318/v1development/profiles service-name
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	collector "go.opentelemetry.io/proto/otlp/collector/profiles/v1development"
	common "go.opentelemetry.io/proto/otlp/common/v1"
	profiles "go.opentelemetry.io/proto/otlp/profiles/v1development"
	resource "go.opentelemetry.io/proto/otlp/resource/v1"
	"google.golang.org/protobuf/proto"
)

// sent is one sample as the program made it.
type sent struct {
	Stack     string `json:"stack"`
	Value     int64  `json:"value"`
	Attribute string `json:"attribute"`
	Linked    bool   `json:"linked"`
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: gootlpold URL SERVICE")
		os.Exit(2)
	}
	url, service := os.Args[1], os.Args[2]

	dict := &profiles.ProfilesDictionary{
		StringTable:    []string{""},
		MappingTable:   []*profiles.Mapping{{}},
		LocationTable:  []*profiles.Location{{}},
		FunctionTable:  []*profiles.Function{{}},
		LinkTable:      []*profiles.Link{{}},
		AttributeTable: []*profiles.KeyValueAndUnit{{}},
		StackTable:     []*profiles.Stack{{}},
	}
	str := func(s string) int32 {
		for i, have := range dict.StringTable {
			if have == s {
				return int32(i)
			}
		}
		dict.StringTable = append(dict.StringTable, s)
		return int32(len(dict.StringTable) - 1)
	}
	location := map[string]int32{}
	frame := func(name string) int32 {
		if i, ok := location[name]; ok {
			return i
		}
		dict.FunctionTable = append(dict.FunctionTable, &profiles.Function{NameStrindex: str(name)})
		f := int32(len(dict.FunctionTable) - 1)
		dict.LocationTable = append(dict.LocationTable, &profiles.Location{
			Lines: []*profiles.Line{{FunctionIndex: f}},
		})
		location[name] = int32(len(dict.LocationTable) - 1)
		return location[name]
	}
	attribute := func(key, value string) int32 {
		dict.AttributeTable = append(dict.AttributeTable, &profiles.KeyValueAndUnit{
			KeyStrindex: str(key),
			Value:       &common.AnyValue{Value: &common.AnyValue_StringValue{StringValue: value}},
		})
		return int32(len(dict.AttributeTable) - 1)
	}
	dict.LinkTable = append(dict.LinkTable, &profiles.Link{
		TraceId: bytes.Repeat([]byte{0xab}, 16),
		SpanId:  bytes.Repeat([]byte{0xcd}, 8),
	})
	const link = int32(1)

	samples := []sent{
		{Stack: "main;serve;parse", Value: 70_000_000, Attribute: "worker-1", Linked: true},
		{Stack: "main;serve;write", Value: 20_000_000, Attribute: "worker-2"},
		{Stack: "main;gc", Value: 5_000_000, Attribute: "gc"},
	}
	var out []*profiles.Sample
	for _, s := range samples {
		frames := strings.Split(s.Stack, ";")
		// A stack's locations are leaf first.
		var locations []int32
		for i := len(frames) - 1; i >= 0; i-- {
			locations = append(locations, frame(frames[i]))
		}
		dict.StackTable = append(dict.StackTable, &profiles.Stack{LocationIndices: locations})
		sample := &profiles.Sample{
			StackIndex:       int32(len(dict.StackTable) - 1),
			Values:           []int64{s.Value},
			AttributeIndices: []int32{attribute("thread.name", s.Attribute)},
		}
		if s.Linked {
			sample.LinkIndex = link
		}
		out = append(out, sample)
	}
	cpu := &profiles.ValueType{TypeStrindex: str("cpu"), UnitStrindex: str("nanoseconds")}
	request := &collector.ExportProfilesServiceRequest{
		Dictionary: dict,
		ResourceProfiles: []*profiles.ResourceProfiles{{
			Resource: &resource.Resource{Attributes: []*common.KeyValue{{
				Key:   "service.name",
				Value: &common.AnyValue{Value: &common.AnyValue_StringValue{StringValue: service}},
			}}},
			ScopeProfiles: []*profiles.ScopeProfiles{{
				Scope: &common.InstrumentationScope{Name: "gootlpold"},
				Profiles: []*profiles.Profile{{
					SampleType:   cpu,
					PeriodType:   cpu,
					Period:       10_000_000,
					TimeUnixNano: uint64(time.Now().UnixNano()),
					DurationNano: uint64(time.Second),
					Samples:      out,
				}},
			}},
		}},
	}
	body, err := proto.Marshal(request)
	if err != nil {
		fmt.Fprintln(os.Stderr, "marshal:", err)
		os.Exit(1)
	}
	resp, err := http.Post(url, "application/x-protobuf", bytes.NewReader(body))
	if err != nil {
		fmt.Fprintln(os.Stderr, "post:", err)
		os.Exit(1)
	}
	answer, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		fmt.Fprintf(os.Stderr, "post: %s: %s\n", resp.Status, answer)
		os.Exit(1)
	}
	if err := json.NewEncoder(os.Stdout).Encode(samples); err != nil {
		fmt.Fprintln(os.Stderr, "print:", err)
		os.Exit(1)
	}
}
