# shellcheck shell=bash
# The Go scrape target of tests/peers/apps/goscrape: net/http/pprof plus two
# known hot functions (goHotLoop ~75%, goWarmLoop ~25% of its CPU).
# Prints GOSCRAPE_ENDPOINT=host:port (pprof under /debug/pprof/).

install_goscrape() { go_app_bin goscrape >/dev/null; }

start_goscrape() {
  local dir port
  dir="$(run_dir goscrape)"
  port="$(free_ports 1)"
  start_bg goscrape "$(go_app_bin goscrape)" -addr "127.0.0.1:$port"
  printf 'GOSCRAPE_ENDPOINT=%s\n' "$(endpoint "$port")" >"$dir/endpoints"
}

ready_goscrape() {
  local ep
  ep="$(sed -n 's/^GOSCRAPE_ENDPOINT=//p' "$(run_dir goscrape)/endpoints")"
  http_ok "http://$ep/debug/pprof/"
}
