# shellcheck shell=bash
# Parca server built from the wrapper module beside this file (go.mod pins the
# release). gRPC, gRPC-Web and the REST gateway (/api/...) share one port.
# Prints PARCA_ENDPOINT=host:port.

parca_dir="$peers_dir/parca"
parca_home() { printf '%s/parca-%s' "$cache_root" "$(go_mod_version "$parca_dir" github.com/parca-dev/parca)"; }

install_parca() {
  build_go_tool parca "$(parca_home)" "$parca_dir" github.com/parca-dev/parca/cmd/parca parca
}

start_parca() {
  local dir port
  dir="$(run_dir parca)"
  port="$(peer_ports parca 1)"
  cat >"$dir/parca.yaml" <<YAML
# Written by tests/peers/up: filesystem object storage in the peer's data dir.
object_storage:
  bucket:
    type: FILESYSTEM
    config:
      directory: $dir/data/objects
YAML
  # A private Parca (tests/peers/private) writes a write-ahead log under
  # --storage-path and replays it when started again; the shared one keeps
  # its data in memory only.
  local wal=()
  [[ -z "${peer_private:-}" ]] || wal=(--storage-enable-wal)
  # Upstream debuginfod points at a closed loopback port: the tests send
  # symbolized profiles, and nothing may leave the machine.
  start_bg parca "$(parca_home)/bin/parca" \
    --config-path="$dir/parca.yaml" \
    --http-address="127.0.0.1:$port" \
    --storage-path="$dir/data/storage" \
    --debuginfo-cache-dir="$dir/data/debuginfo-cache" \
    --debuginfod-upstream-servers=127.0.0.1:9 \
    --profile-share-server=127.0.0.1:9 \
    "${wal[@]}"
  printf 'PARCA_ENDPOINT=%s\n' "$(endpoint "$port")" >"$dir/endpoints"
}

# Ready when the query API answers through the REST gateway (which itself
# dials the gRPC server on the same port).
ready_parca() {
  local ep
  ep="$(sed -n 's/^PARCA_ENDPOINT=//p' "$(run_dir parca)/endpoints")"
  http_ok "http://$ep/api/profiles/types"
}
