"""Sends one OTLP profiles request built with the official Python classes.

For proflow's end-to-end tests: the request is made with the
``opentelemetry-proto`` package's generated classes (pinned in
requirements.txt beside this file), serialized by the Python protobuf runtime,
POSTed as ``application/x-protobuf`` to an OTLP/HTTP profiles endpoint (an
OpenTelemetry Collector's ``otlp`` receiver, or proflow's), and the very bytes
sent are written to a file, so the test can decode exactly what left here.

Usage::

    python send.py --url URL --tag TAG --out FILE

``URL`` is the full endpoint (``http://HOST:PORT/v1development/profiles``).
``TAG`` makes the service and function names unique, so tests running in
parallel against one collector or proflow do not see each other's profiles:
the services are ``TAG-checkout`` and ``TAG-search`` and every function name
starts with ``TAG.``.

What it sends (OTLP profiles 1.10, ``v1development``): two resources
(``service.name`` and attributes of every scalar kind and an array), each with
a scope (name, version, an attribute); ``TAG-checkout`` has a CPU profile
(``samples``/``count``, period ``cpu``/``nanoseconds``, values with one
timestamp each) and an allocation profile (``alloc_space``/``bytes``),
``TAG-search`` a CPU profile. One dictionary serves all three: entry 0 of every
table the zero value; mappings with a GNU build id attribute; functions with
names, system names, file names and start lines; locations with an address
and lines, one with an inlined frame, one unsymbolized; stacks shared between
profiles; sample attributes (``thread.name``, and an int with a unit); a link
with a trace and a span id.

With ``--addresses FILE`` it sends instead one CPU profile (``cpu``/
``nanoseconds``, period 10 ms) of one process, service ``TAG``, whose
locations hold addresses only (no lines, no functions: for a symbolizer to
name). ``FILE`` is JSON::

    {"mapping": {"filename": "/path", "memory_start": 4194304,
                 "memory_limit": 4198400, "file_offset": 4096,
                 "build_id": "hex"},
     "samples": [{"addresses": [leaf, ..., root], "value": 200000000}]}

With ``--trace-link FILE --traces-url URL`` it first POSTs the spans ``FILE``
names as an OTLP ``ExportTraceServiceRequest`` (protobuf, the package's trace
classes; service ``TAG``) to ``URL`` (``http://HOST:PORT/v1/traces``), then
sends one CPU profile (``cpu``/``nanoseconds``) of service ``TAG`` whose
samples are one frame each (function ``TAG.NAME``) and name a span as a
``span_id`` sample attribute (hex as given), without a trace id and without a
link. ``FILE`` is JSON::

    {"spans": [{"trace_id": "32 hex", "span_id": "16 hex", "name": "checkout"}],
     "samples": [{"function": "NAME", "value": 30000000, "span_id": "16 hex"}]}

(a sample's ``span_id`` may be null: no attribute).

Exit status 0 only when the endpoint answered 200 with a response that
rejected nothing; otherwise the answer is printed on stderr and the status is 1.
"""

import argparse
import json
import sys
import time
import urllib.error
import urllib.request

from opentelemetry.proto.collector.profiles.v1development import profiles_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.profiles.v1development import profiles_pb2
from opentelemetry.proto.resource.v1 import resource_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

# OTLP profiles 1.10 renumbered Sample's fields; a package on an earlier
# version would serialize a request that decodes into nonsense elsewhere.
SAMPLE_FIELDS_1_10 = {
    "stack_index": 1,
    "attribute_indices": 2,
    "link_index": 3,
    "values": 4,
    "timestamps_unix_nano": 5,
}

BUILD_ID_KEY = "process.executable.build_id.gnu"


def check_otlp_version():
    fields = {f.name: f.number for f in profiles_pb2.Sample.DESCRIPTOR.fields}
    if fields != SAMPLE_FIELDS_1_10:
        sys.exit(
            "opentelemetry-proto's Sample is not OTLP profiles 1.10: fields "
            f"{fields}, expected {SAMPLE_FIELDS_1_10}"
        )


def any_value(value):
    """An AnyValue for a Python bool, int, float, str, bytes or list."""
    v = common_pb2.AnyValue()
    # bool first: it is an int too.
    if isinstance(value, bool):
        v.bool_value = value
    elif isinstance(value, int):
        v.int_value = value
    elif isinstance(value, float):
        v.double_value = value
    elif isinstance(value, str):
        v.string_value = value
    elif isinstance(value, bytes):
        v.bytes_value = value
    elif isinstance(value, list):
        v.array_value.values.extend(any_value(x) for x in value)
    else:
        raise TypeError(f"no AnyValue for {value!r}")
    return v


def key_value(key, value):
    return common_pb2.KeyValue(key=key, value=any_value(value))


class Dictionary:
    """The request's one ProfilesDictionary.

    Entry 0 of every table is the zero value (the spec requires it; index 0
    means "none"), and an entry equal to one already in its table is not
    added again: its index is reused.
    """

    TABLES = (
        "mapping_table",
        "location_table",
        "function_table",
        "link_table",
        "attribute_table",
        "stack_table",
    )

    def __init__(self):
        self.message = profiles_pb2.ProfilesDictionary()
        self._indexes = {}
        self.message.string_table.append("")
        self._indexes[("string_table", "")] = 0
        for table in self.TABLES:
            getattr(self.message, table).add()
            # The zero value serializes to no bytes.
            self._indexes[(table, b"")] = 0

    def string(self, s):
        key = ("string_table", s)
        if key not in self._indexes:
            self._indexes[key] = len(self.message.string_table)
            self.message.string_table.append(s)
        return self._indexes[key]

    def _entry(self, table, entry):
        key = (table, entry.SerializeToString(deterministic=True))
        if key not in self._indexes:
            rows = getattr(self.message, table)
            self._indexes[key] = len(rows)
            rows.add().CopyFrom(entry)
        return self._indexes[key]

    def attribute(self, key, value, unit=""):
        return self._entry(
            "attribute_table",
            profiles_pb2.KeyValueAndUnit(
                key_strindex=self.string(key),
                value=any_value(value),
                unit_strindex=self.string(unit),
            ),
        )

    def mapping(self, filename, start, limit, offset, build_id):
        return self._entry(
            "mapping_table",
            profiles_pb2.Mapping(
                memory_start=start,
                memory_limit=limit,
                file_offset=offset,
                filename_strindex=self.string(filename),
                attribute_indices=[self.attribute(BUILD_ID_KEY, build_id)],
            ),
        )

    def function(self, name, system_name, filename, start_line):
        return self._entry(
            "function_table",
            profiles_pb2.Function(
                name_strindex=self.string(name),
                system_name_strindex=self.string(system_name),
                filename_strindex=self.string(filename),
                start_line=start_line,
            ),
        )

    def location(self, mapping, address, lines):
        """``lines``: (function, line, column), innermost first: all but the
        last were inlined into the last."""
        return self._entry(
            "location_table",
            profiles_pb2.Location(
                mapping_index=mapping,
                address=address,
                lines=[
                    profiles_pb2.Line(function_index=f, line=line, column=column)
                    for f, line, column in lines
                ],
            ),
        )

    def stack(self, locations):
        """``locations``: leaf first."""
        return self._entry("stack_table", profiles_pb2.Stack(location_indices=locations))

    def link(self, trace_id_hex, span_id_hex):
        return self._entry(
            "link_table",
            profiles_pb2.Link(
                trace_id=bytes.fromhex(trace_id_hex), span_id=bytes.fromhex(span_id_hex)
            ),
        )

    def value_type(self, type_, unit):
        return profiles_pb2.ValueType(
            type_strindex=self.string(type_), unit_strindex=self.string(unit)
        )


def build_request(tag, now_ns):
    d = Dictionary()
    app = d.mapping(
        "/usr/local/bin/checkout", 0x400000, 0x9F3000, 0, "4a3c9e0f1b2d5e6f7a8b9c0d1e2f3a4b5c6d7e8f"
    )
    libc = d.mapping(
        "/usr/lib/x86_64-linux-gnu/libc.so.6",
        0x7F3A1C200000,
        0x7F3A1C3D5000,
        0x28000,
        "c289da5071a3399de893d2af81d6a30c62646e1e",
    )

    def fn(name, filename, start_line):
        full = f"{tag}.{name}"
        # The linker's (mangled) name differs from the source name.
        return d.function(full, f"_ZN{len(full)}{full}E", filename, start_line)

    main = fn("main", "cmd/checkout/main.go", 12)
    serve = fn("serve", "internal/server/server.go", 40)
    handle = fn("handle_request", "internal/server/handler.go", 88)
    parse = fn("parse_json", "internal/codec/json.go", 17)
    decode = fn("decode_utf8", "internal/codec/utf8.go", 5)
    write = fn("write_response", "internal/server/handler.go", 140)
    gc = fn("gc_mark", "runtime/mgcmark.go", 1200)
    search = fn("search_index", "internal/index/search.go", 61)

    main_loc = d.location(app, 0x401A2C, [(main, 31, 9)])
    serve_loc = d.location(app, 0x45B010, [(serve, 57, 14)])
    handle_loc = d.location(app, 0x4612F8, [(handle, 102, 21)])
    # decode_utf8 was inlined into parse_json: one location, two lines.
    parse_loc = d.location(app, 0x4780C4, [(decode, 9, 3), (parse, 22, 11)])
    write_loc = d.location(app, 0x461B40, [(write, 151, 5)])
    gc_loc = d.location(app, 0x40C7E0, [(gc, 1234, 2)])
    search_loc = d.location(app, 0x4A0010, [(search, 70, 4)])
    # A native frame nobody symbolized: an address in libc, no lines.
    memcpy_loc = d.location(libc, 0x7F3A1C2A9F40, [])

    parse_stack = d.stack([parse_loc, handle_loc, serve_loc, main_loc])
    write_stack = d.stack([memcpy_loc, write_loc, handle_loc, serve_loc, main_loc])
    gc_stack = d.stack([gc_loc, main_loc])
    search_stack = d.stack([search_loc, handle_loc, serve_loc, main_loc])

    worker1 = d.attribute("thread.name", "worker-1")
    worker2 = d.attribute("thread.name", "worker-2")
    gc_thread = d.attribute("thread.name", "gc")
    body = d.attribute("http.request.body.size", 5120, "bytes")
    link = d.link("5b8efff798038103d269b633813fc60c", "eee19b7ec3c1b174")

    second = 1_000_000_000
    start = now_ns - 10 * second

    def at(*offsets_ms):
        return [start + ms * 1_000_000 for ms in offsets_ms]

    def cpu_profile(samples, profile_id):
        return profiles_pb2.Profile(
            sample_type=d.value_type("samples", "count"),
            period_type=d.value_type("cpu", "nanoseconds"),
            period=10_000_000,
            time_unix_nano=start,
            duration_nano=10 * second,
            profile_id=profile_id,
            samples=samples,
        )

    checkout_cpu = cpu_profile(
        [
            profiles_pb2.Sample(
                stack_index=parse_stack,
                attribute_indices=[worker1, body],
                link_index=link,
                values=[1, 2, 1],
                timestamps_unix_nano=at(120, 130, 990),
            ),
            profiles_pb2.Sample(
                stack_index=write_stack,
                attribute_indices=[worker2],
                values=[3],
                timestamps_unix_nano=at(4_500),
            ),
            profiles_pb2.Sample(
                stack_index=gc_stack,
                attribute_indices=[gc_thread],
                values=[1, 1],
                timestamps_unix_nano=at(7_000, 9_999),
            ),
        ],
        bytes.fromhex("0102030405060708090a0b0c0d0e0f10"),
    )
    checkout_alloc = profiles_pb2.Profile(
        sample_type=d.value_type("alloc_space", "bytes"),
        period_type=d.value_type("space", "bytes"),
        period=524_288,
        time_unix_nano=start,
        duration_nano=10 * second,
        profile_id=bytes.fromhex("1112131415161718191a1b1c1d1e1f20"),
        samples=[
            # The same stack and attributes as a CPU sample: shared entries.
            profiles_pb2.Sample(
                stack_index=parse_stack, attribute_indices=[worker1], values=[1_048_576]
            ),
            profiles_pb2.Sample(
                stack_index=write_stack, attribute_indices=[worker2], values=[65_536]
            ),
        ],
    )
    search_cpu = cpu_profile(
        [
            profiles_pb2.Sample(
                stack_index=search_stack,
                attribute_indices=[worker1],
                values=[5, 4],
                timestamps_unix_nano=at(2_000, 2_010),
            ),
            profiles_pb2.Sample(
                stack_index=gc_stack,
                attribute_indices=[gc_thread],
                values=[1],
                timestamps_unix_nano=at(8_000),
            ),
        ],
        bytes.fromhex("2122232425262728292a2b2c2d2e2f30"),
    )

    def resource(service, host, pid, canary, load, args):
        return resource_pb2.Resource(
            attributes=[
                key_value("service.name", service),
                key_value("host.name", host),
                key_value("process.pid", pid),
                key_value("deployment.canary", canary),
                key_value("host.cpu.load", load),
                key_value("process.command_args", args),
            ]
        )

    def scope(mode):
        return common_pb2.InstrumentationScope(
            name="proflow.test.python-profiler",
            version="1.2.3",
            attributes=[key_value("profiler.mode", mode)],
        )

    return profiles_service_pb2.ExportProfilesServiceRequest(
        resource_profiles=[
            profiles_pb2.ResourceProfiles(
                resource=resource(
                    f"{tag}-checkout", "web-1", 4242, True, 0.75, ["checkout", "--port", "8080"]
                ),
                scope_profiles=[
                    profiles_pb2.ScopeProfiles(
                        scope=scope("sampling"), profiles=[checkout_cpu, checkout_alloc]
                    )
                ],
            ),
            profiles_pb2.ResourceProfiles(
                resource=resource(f"{tag}-search", "web-2", 777, False, 1.5, ["search", "-v"]),
                scope_profiles=[
                    profiles_pb2.ScopeProfiles(scope=scope("tracing"), profiles=[search_cpu])
                ],
            ),
        ],
        dictionary=d.message,
    )


def cpu_request(d, tag, samples, now_ns):
    """One CPU profile (cpu/nanoseconds, period 10 ms, the last 10 s) of
    `samples` for service `tag`, in a request with the dictionary `d`."""
    second = 1_000_000_000
    profile = profiles_pb2.Profile(
        sample_type=d.value_type("cpu", "nanoseconds"),
        period_type=d.value_type("cpu", "nanoseconds"),
        period=10_000_000,
        time_unix_nano=now_ns - 10 * second,
        duration_nano=10 * second,
        samples=samples,
    )
    return profiles_service_pb2.ExportProfilesServiceRequest(
        resource_profiles=[
            profiles_pb2.ResourceProfiles(
                resource=resource_pb2.Resource(attributes=[key_value("service.name", tag)]),
                scope_profiles=[profiles_pb2.ScopeProfiles(profiles=[profile])],
            )
        ],
        dictionary=d.message,
    )


def build_addresses_request(tag, spec, now_ns):
    """One CPU profile of addresses in one mapping, as ``spec`` describes."""
    d = Dictionary()
    m = spec["mapping"]
    mapping = d.mapping(
        m["filename"], m["memory_start"], m["memory_limit"], m["file_offset"], m["build_id"]
    )
    samples = []
    for s in spec["samples"]:
        stack = d.stack([d.location(mapping, a, []) for a in s["addresses"]])
        samples.append(profiles_pb2.Sample(stack_index=stack, values=[s["value"]]))
    return cpu_request(d, tag, samples, now_ns)


def build_spans_request(tag, spec, now_ns):
    """The spans ``spec`` names, each 100 ms long, ended a second ago."""
    second = 1_000_000_000
    spans = [
        trace_pb2.Span(
            trace_id=bytes.fromhex(s["trace_id"]),
            span_id=bytes.fromhex(s["span_id"]),
            name=s["name"],
            kind=trace_pb2.Span.SPAN_KIND_SERVER,
            start_time_unix_nano=now_ns - second - 100_000_000,
            end_time_unix_nano=now_ns - second,
        )
        for s in spec["spans"]
    ]
    return trace_service_pb2.ExportTraceServiceRequest(
        resource_spans=[
            trace_pb2.ResourceSpans(
                resource=resource_pb2.Resource(attributes=[key_value("service.name", tag)]),
                scope_spans=[trace_pb2.ScopeSpans(spans=spans)],
            )
        ]
    )


def build_trace_link_request(tag, spec, now_ns):
    """One CPU profile whose samples name spans by a ``span_id`` attribute."""
    d = Dictionary()
    samples = []
    for s in spec["samples"]:
        function = d.function(f"{tag}.{s['function']}", "", "", 0)
        stack = d.stack([d.location(0, 0, [(function, 0, 0)])])
        attributes = [] if s["span_id"] is None else [d.attribute("span_id", s["span_id"])]
        samples.append(
            profiles_pb2.Sample(
                stack_index=stack, attribute_indices=attributes, values=[s["value"]]
            )
        )
    return cpu_request(d, tag, samples, now_ns)


def post(url, body, response_class=profiles_service_pb2.ExportProfilesServiceResponse):
    """POSTs ``body``; returns None on success, else what went wrong."""
    request = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": "application/x-protobuf"}
    )
    # Loopback only: never through a proxy from the environment.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=30) as reply:
            status, answer = reply.status, reply.read()
    except urllib.error.HTTPError as e:
        return f"{url} answered {e.code}: {e.read()!r}"
    except urllib.error.URLError as e:
        return f"POST {url} failed: {e.reason}"
    if status != 200:
        return f"{url} answered {status}: {answer!r}"
    response = response_class()
    response.ParseFromString(answer)
    partial = response.partial_success
    rejected = getattr(partial, "rejected_profiles", 0) or getattr(partial, "rejected_spans", 0)
    if rejected or partial.error_message:
        return f"{url} rejected {rejected}: {partial.error_message}"
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="OTLP/HTTP profiles endpoint")
    parser.add_argument("--tag", required=True, help="prefix of service and function names")
    parser.add_argument("--out", required=True, help="file for the serialized request sent")
    parser.add_argument(
        "--addresses", help="JSON file: send one profile of these addresses instead"
    )
    parser.add_argument(
        "--trace-link",
        help="JSON file: send these spans to --traces-url, then one profile naming them",
    )
    parser.add_argument("--traces-url", help="OTLP/HTTP traces endpoint (with --trace-link)")
    args = parser.parse_args()
    if bool(args.trace_link) != bool(args.traces_url):
        parser.error("--trace-link and --traces-url go together")

    check_otlp_version()
    if args.trace_link:
        with open(args.trace_link) as f:
            spec = json.load(f)
        spans = build_spans_request(args.tag, spec, time.time_ns()).SerializeToString()
        problem = post(args.traces_url, spans, trace_service_pb2.ExportTraceServiceResponse)
        if problem:
            print(problem, file=sys.stderr)
            return 1
        print(f"sent {len(spec['spans'])} spans ({len(spans)} bytes) to {args.traces_url}")
        request = build_trace_link_request(args.tag, spec, time.time_ns())
    elif args.addresses:
        with open(args.addresses) as f:
            spec = json.load(f)
        request = build_addresses_request(args.tag, spec, time.time_ns())
    else:
        request = build_request(args.tag, time.time_ns())
    body = request.SerializeToString()
    # Written before sending, so a failed send can still be looked at.
    with open(args.out, "wb") as f:
        f.write(body)
    problem = post(args.url, body)
    if problem:
        print(problem, file=sys.stderr)
        return 1
    print(f"sent {len(body)} bytes to {args.url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
