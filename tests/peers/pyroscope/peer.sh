# shellcheck shell=bash
# Grafana Pyroscope server built from the wrapper module beside this file
# (go.mod pins the release and repeats the replaces it needs). Single binary,
# filesystem storage in the peer's data dir, self-profiling push off.
# Prints PYROSCOPE_ENDPOINT=host:port (HTTP/1.1 and h2c: /ingest, Connect, gRPC).
# PROFLOW_PYROSCOPE_MULTITENANT=1 (a private peer's start variable) turns on
# multi-tenancy: every request then needs X-Scope-OrgID.

pyroscope_dir="$peers_dir/pyroscope"
pyroscope_home() { printf '%s/pyroscope-%s' "$cache_root" "$(go_mod_version "$pyroscope_dir" github.com/grafana/pyroscope)"; }

install_pyroscope() {
  # github.com/grafana/dskit at the pinned pseudo-version is missing from the
  # checksum database reachable here; its hash is pinned in go.sum instead.
  GONOSUMDB_EXTRA=github.com/grafana/dskit \
    build_go_tool pyroscope "$(pyroscope_home)" "$pyroscope_dir" github.com/grafana/pyroscope/cmd/pyroscope pyroscope
}

start_pyroscope() {
  local dir http grpc memberlist
  dir="$(run_dir pyroscope)"
  read -r http grpc memberlist < <(peer_ports pyroscope 3)
  mkdir -p "$dir/data/shared" "$dir/data/pyroscopedb"
  local tenancy=()
  [[ "${PROFLOW_PYROSCOPE_MULTITENANT:-}" == 1 ]] && tenancy=(-auth.multitenancy-enabled=true)
  # Every ring advertises 127.0.0.1: the default is the first private
  # interface's address, where nothing listens. No usage reporting, no tracing.
  start_bg pyroscope "$(pyroscope_home)/bin/pyroscope" \
    -target=all \
    -server.http-listen-address=127.0.0.1 -server.http-listen-port="$http" \
    -server.grpc-listen-address=127.0.0.1 -server.grpc-listen-port="$grpc" \
    -memberlist.bind-addr=127.0.0.1 -memberlist.bind-port="$memberlist" \
    -memberlist.advertise-addr=127.0.0.1 -memberlist.advertise-port="$memberlist" \
    -memberlist.join=127.0.0.1:"$memberlist" -memberlist.leave-timeout=1s \
    -ingester.lifecycler.addr=127.0.0.1 \
    -distributor.ring.instance-addr=127.0.0.1 \
    -compactor.ring.instance-addr=127.0.0.1 \
    -overrides-exporter.ring.instance-addr=127.0.0.1 \
    -query-frontend.instance-addr=127.0.0.1 \
    -query-scheduler.ring.instance-addr=127.0.0.1 \
    -store-gateway.sharding-ring.instance-addr=127.0.0.1 \
    -ingester.min-ready-duration=0s \
    -storage.backend=filesystem -storage.filesystem.dir="$dir/data/shared" \
    -pyroscopedb.data-path="$dir/data/pyroscopedb" \
    -self-profiling.disable-push=true \
    -usage-stats.enabled=false \
    -tracing.enabled=false \
    -distributor.ingestion-rate-limit-mb=1024 -distributor.ingestion-burst-size-mb=1024 \
    "${tenancy[@]}"
  printf 'PYROSCOPE_ENDPOINT=%s\n' "$(endpoint "$http")" >"$dir/endpoints"
}

ready_pyroscope() {
  local ep
  ep="$(sed -n 's/^PYROSCOPE_ENDPOINT=//p' "$(run_dir pyroscope)/endpoints")"
  [[ "$(curl -fsS --max-time 2 "http://$ep/ready" 2>/dev/null)" == ready* ]]
}
