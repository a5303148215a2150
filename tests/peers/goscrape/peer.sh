# shellcheck shell=bash
# The Go scrape target of tests/peers/apps/goscrape: net/http/pprof plus known
# functions (goHotLoop ~75%, goWarmLoop ~25% of its CPU; goAllocLoop 4 MiB/s;
# goMutexContend, goBlockWait; see the header of its main.go), default flags.
# Prints GOSCRAPE_ENDPOINT=host:port (pprof under /debug/pprof/).

install_goscrape() { go_app_bin goscrape >/dev/null; }

start_goscrape() {
  local dir port bin
  dir="$(run_dir goscrape)"
  port="$(free_ports 1)"
  bin="$(go_app_bin goscrape)"
  # Kept so that stale_goscrape can tell which build runs.
  printf '%s\n' "$bin" >"$dir/bin"
  start_bg goscrape "$bin" -addr "127.0.0.1:$port"
  printf 'GOSCRAPE_ENDPOINT=%s\n' "$(endpoint "$port")" >"$dir/endpoints"
}

ready_goscrape() {
  local ep
  ep="$(sed -n 's/^GOSCRAPE_ENDPOINT=//p' "$(run_dir goscrape)/endpoints")"
  http_ok "http://$ep/debug/pprof/"
}

# The cached binary is keyed by a digest of the sources (go_app_bin), so a
# running instance started from another path was built from other sources,
# an edited main.go or another checkout. One started before the harness
# recorded its binary counts as outdated too.
stale_goscrape() {
  local want
  want="$(go_app_bin goscrape)"
  [[ "$(cat "$(run_dir goscrape)/bin" 2>/dev/null)" != "$want" ]]
}
