# shellcheck shell=bash
# debuginfod (Debian package) serving the ELF/DWARF files under a directory,
# for the symbolize processor's tests. The directory is
# $PROFLOW_DEBUGINFOD_DIR if set, else an empty one in the peer's data dir
# (tests may drop files there; it is rescanned every second).
# Prints DEBUGINFOD_ENDPOINT=host:port and DEBUGINFOD_DIR=path.

debuginfod_dir="$peers_dir/debuginfod"
debuginfod_home() { printf '%s/debuginfod-shim-%s' "$cache_root" "$(files_digest "$debuginfod_dir/bind_loopback.c")"; }

install_debuginfod() {
  if ! command -v debuginfod >/dev/null; then
    if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
      log "debuginfod: installing the Debian package debuginfod"
      mkdir -p "$cache_root"
      DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 install -y -qq debuginfod >"$cache_root/debuginfod-apt.log" 2>&1 \
        || { cat "$cache_root/debuginfod-apt.log" >&2; die "debuginfod: apt-get install debuginfod failed (log above)"; }
    else
      die "debuginfod: not installed; install the Debian package debuginfod"
    fi
  fi
  local home; home="$(debuginfod_home)"
  if [[ ! -f "$home/bind_loopback.so" ]]; then
    command -v cc >/dev/null || die "debuginfod: 'cc' is needed to build the loopback bind shim"
    mkdir -p "$home"
    cc -shared -fPIC -O2 -o "$home/bind_loopback.so.tmp" "$debuginfod_dir/bind_loopback.c" -ldl \
      || die "debuginfod: building the loopback bind shim failed"
    mv -f "$home/bind_loopback.so.tmp" "$home/bind_loopback.so"
  fi
}

start_debuginfod() {
  local dir port serve
  dir="$(run_dir debuginfod)"
  port="$(free_ports 1)"
  serve="${PROFLOW_DEBUGINFOD_DIR:-$dir/data/files}"
  mkdir -p "$serve"
  start_bg debuginfod env LD_PRELOAD="$(debuginfod_home)/bind_loopback.so" \
    debuginfod --port="$port" --database="$dir/data/debuginfod.sqlite" \
    --rescan-time=1 --groom-time=0 --scan-file-dir "$serve"
  {
    printf 'DEBUGINFOD_ENDPOINT=%s\n' "$(endpoint "$port")"
    printf 'DEBUGINFOD_DIR=%s\n' "$serve"
  } >"$dir/endpoints"
}

ready_debuginfod() {
  local ep
  ep="$(sed -n 's/^DEBUGINFOD_ENDPOINT=//p' "$(run_dir debuginfod)/endpoints")"
  http_ok "http://$ep/metrics"
}
