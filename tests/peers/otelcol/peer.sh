# shellcheck shell=bash
# OpenTelemetry Collector built with the collector builder (ocb) from
# builder-config.yaml beside this file, run with config.yaml and profiles on.
# Prints OTELCOL_ENDPOINT (OTLP gRPC), OTELCOL_HTTP_ENDPOINT (OTLP HTTP),
# OTELCOL_METRICS_ENDPOINT (its own Prometheus metrics: what its receiver
# took and its exporters sent), OTELCOL_FILE_PATH (the file exporter's
# output, OTLP JSON lines) and OTELCOL_BIN (the collector binary, for tests
# that run one of their own).

otelcol_dir="$peers_dir/otelcol"
otelcol_version() { sed -n 's/^ *version: *\([0-9][0-9.]*\)-proflow.*/v\1/p' "$otelcol_dir/builder-config.yaml"; }
otelcol_home() { printf '%s/otelcol-%s' "$cache_root" "$(otelcol_version)"; }

install_otelcol() {
  local ver home ocb stamp digest
  ver="$(otelcol_version)"
  [[ -n "$ver" ]] || die "otelcol: no 'version: X.Y.Z-proflow' in $otelcol_dir/builder-config.yaml"
  home="$(otelcol_home)"
  stamp="$home/.proflow-built"
  digest="$(files_digest "$otelcol_dir/builder-config.yaml")"
  if [[ -x "$home/src/otelcol-proflow" && "$(cat "$stamp" 2>/dev/null)" == "$digest" ]]; then
    return 0
  fi
  command -v go >/dev/null || die "otelcol: 'go' is not on PATH; it is needed to build the collector"
  # The builder itself, same version as the components it assembles.
  ocb="$cache_root/ocb-$ver/bin/builder"
  if [[ ! -x "$ocb" ]]; then
    log "otelcol: installing the collector builder $ver"
    mkdir -p "$cache_root/ocb-$ver"
    if ! nice -n "${PROFLOW_PEERS_NICE:-19}" env GOBIN="$cache_root/ocb-$ver/bin" GOFLAGS=-trimpath \
        go install "go.opentelemetry.io/collector/cmd/builder@$ver" >"$cache_root/ocb-$ver/install.log" 2>&1; then
      cat "$cache_root/ocb-$ver/install.log" >&2
      die "otelcol: go install go.opentelemetry.io/collector/cmd/builder@$ver failed (log above)"
    fi
  fi
  log "otelcol: building the collector $ver with ocb (several minutes on a cold cache)"
  rm -rf "$home/src"
  mkdir -p "$home"
  sed "s#@OUTPUT_PATH@#$home/src#" "$otelcol_dir/builder-config.yaml" >"$home/builder-config.yaml"
  local started=$SECONDS
  if ! (cd "$home" && nice -n "${PROFLOW_PEERS_NICE:-19}" env \
        GOFLAGS="-buildvcs=false -p=${PROFLOW_PEERS_BUILD_JOBS:-2}" \
        "$ocb" --config "$home/builder-config.yaml") >"$home/build.log" 2>&1; then
    cat "$home/build.log" >&2
    die "otelcol: the collector builder failed (log above, also in $home/build.log)"
  fi
  printf '%s' "$digest" >"$stamp"
  log "otelcol: built in $((SECONDS - started))s"
}

start_otelcol() {
  local dir grpc http metrics
  dir="$(run_dir otelcol)"
  read -r grpc http metrics < <(free_ports 3)
  start_bg otelcol env OTELCOL_GRPC_PORT="$grpc" OTELCOL_HTTP_PORT="$http" \
    OTELCOL_METRICS_PORT="$metrics" \
    OTELCOL_FILE_PATH="$dir/data/profiles.jsonl" \
    "$(otelcol_home)/src/otelcol-proflow" --config "$otelcol_dir/config.yaml" \
    --feature-gates=+service.profilesSupport
  {
    printf 'OTELCOL_ENDPOINT=%s\n' "$(endpoint "$grpc")"
    printf 'OTELCOL_HTTP_ENDPOINT=%s\n' "$(endpoint "$http")"
    printf 'OTELCOL_METRICS_ENDPOINT=%s\n' "$(endpoint "$metrics")"
    printf 'OTELCOL_FILE_PATH=%s\n' "$dir/data/profiles.jsonl"
    printf 'OTELCOL_BIN=%s\n' "$(otelcol_home)/src/otelcol-proflow"
  } >"$dir/endpoints"
}

# Ready when the OTLP/HTTP profiles path accepts an (empty) export request:
# that path exists only once the profiles pipeline is running.
ready_otelcol() {
  local ep
  ep="$(sed -n 's/^OTELCOL_HTTP_ENDPOINT=//p' "$(run_dir otelcol)/endpoints")"
  http_ok -X POST -H 'Content-Type: application/json' --data '{}' "http://$ep/v1development/profiles"
}
