# shellcheck shell=bash
# Shared by tests/peers/up and tests/peers/down: where things live, how a peer is
# installed (once per version), started in the background, probed and stopped.
#
#   cache  ${PROFLOW_PEERS_CACHE:-${XDG_CACHE_HOME:-~/.cache}/proflow-peers}/<peer>-<version>/
#          built binaries and jars; never inside the repository
#   run    ${PROFLOW_PEERS_RUN:-${TMPDIR:-/tmp}/proflow-peers}/<peer>/
#          pid, log, config, data and the endpoint lines of a running peer;
#          `down` removes it
#
# Each peer is defined by tests/peers/<peer>/peer.sh with three functions:
# install_<peer> (idempotent, run under a per-peer lock), start_<peer> (picks
# free ports, writes config, launches with start_bg, writes the endpoint lines)
# and ready_<peer> (one real probe; exit status only), and optionally
# stale_<peer> (true when the running instance is an outdated build, which
# `up` then restarts instead of reusing). Stopping is the same for all: the
# peer runs in its own session, and its process group is killed.
#
# tests/peers/private runs the same functions with the run root set to a
# test's own directory and can start a stopped peer again there. Peers it
# supports (pyroscope, parca, kafka) take their ports from peer_ports, so they
# come back on the ports of their first start, and reuse the data they find in
# their data dir.

peers_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo_dir="$(cd "$peers_dir/../.." && pwd)"
cache_root="$(realpath -m "${PROFLOW_PEERS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/proflow-peers}")"
run_root="$(realpath -m "${PROFLOW_PEERS_RUN:-${TMPDIR:-/tmp}/proflow-peers}")"

known_peers=(pyroscope parca kafka otelcol debuginfod goscrape kube)

log() { printf 'peers: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

case "$cache_root/" in
  "$(realpath "$repo_dir")/"*) die "cache $cache_root is inside the repository; set PROFLOW_PEERS_CACHE elsewhere" ;;
esac

is_known_peer() {
  local p
  for p in "${known_peers[@]}"; do [[ "$p" == "$1" ]] && return 0; done
  return 1
}

run_dir() { printf '%s/%s' "$run_root" "$1"; }

# sha256 of the given files, to notice an edited pin or manifest.
files_digest() { cat "$@" | sha256sum | cut -c1-16; }

# free_ports N: N distinct free TCP ports on 127.0.0.1, space-separated. All
# sockets are held open together so the ports differ. Picked below the range
# the kernel hands out for port 0 (net.ipv4.ip_local_port_range), where every
# test's own servers and clients get theirs: a peer stopped and started again
# on its ports (tests/peers/private) was seen to find one taken in between by
# another test's gRPC server, which answered the exporter UNIMPLEMENTED.
# Falls back to port 0 when that range leaves too little room below it.
free_ports() {
  python3 - "$1" <<'PY'
import random, socket, sys
n = int(sys.argv[1])
try:
    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
except (OSError, ValueError, IndexError):
    low = 0
socks = []
if low - 10000 >= 4096:
    for _ in range(10000):
        if len(socks) == n:
            break
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", random.randrange(10000, low)))
        except OSError:
            s.close()
            continue
        socks.append(s)
while len(socks) < n:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
}

# peer_ports PEER N: the N ports PEER listens on, space-separated: picked by
# free_ports on the first start in its run dir and kept in its `ports` file,
# so a peer started again in the same run dir (tests/peers/private) comes back
# on the same ports. `up` always starts in a fresh run dir, so fresh ports.
peer_ports() {
  local f; f="$(run_dir "$1")/ports"
  if [[ ! -s "$f" ]]; then
    free_ports "$2" >"$f.tmp"
    mv -f "$f.tmp" "$f"
  fi
  cat "$f"
}

# with_install_lock PEER CMD...: one installer per peer per cache at a time.
with_install_lock() {
  local peer="$1"; shift
  mkdir -p "$cache_root"
  (
    flock 8
    "$@"
  ) 8>"$cache_root/.install-$peer.lock"
}

# build_go_tool PEER DEST_DIR WRAPPER_DIR PKG BIN_NAME: builds PKG from the
# wrapper module in WRAPPER_DIR into DEST_DIR/bin/BIN_NAME, unless the stamp
# there says it was built from the same go.mod and go.sum.
build_go_tool() { build_go_tools "$1" "$3" "$2|$4|$5"; }

# build_go_tools PEER WRAPPER_DIR 'DEST_DIR|PKG|BIN_NAME'...: build_go_tool for
# several binaries of one wrapper module, in one `go build`, so that the
# packages they share are compiled once and the links of two binaries overlap
# on two cores. Only the binaries whose stamp is outdated are built. Without
# DWARF and symbol tables (-s -w): nothing reads them, and the linker spends a
# large part of its time writing them.
build_go_tools() {
  local peer="$1" wrapper="$2"; shift 2
  local digest spec dest pkg bin todo=() pkgs=()
  digest="$(files_digest "$wrapper/go.mod" "$wrapper/go.sum")"
  for spec in "$@"; do
    IFS='|' read -r dest pkg bin <<<"$spec"
    if [[ ! -x "$dest/bin/$bin" || "$(cat "$dest/.proflow-built" 2>/dev/null)" != "$digest" ]]; then
      todo+=("$spec")
      pkgs+=("$pkg")
    fi
  done
  ((${#todo[@]})) || return 0
  command -v go >/dev/null || die "$peer: 'go' is not on PATH; it is needed to build ${pkgs[*]}"
  log "$peer: building ${pkgs[*]} (several minutes on a cold cache)"
  mkdir -p "$cache_root"
  local started=$SECONDS out buildlog
  out="$(mktemp -d "$cache_root/.build-$peer.XXXXXX")"
  buildlog="$out/build.log"
  # -mod=readonly: the committed go.sum is the pin; nothing is resolved anew.
  # `-o DIR/` names each binary as `go build` does: the package's last path
  # element, or the one before a major-version suffix (/v3).
  if ! (cd "$wrapper" && nice -n "${PROFLOW_PEERS_NICE:-19}" env \
        GOFLAGS="-mod=readonly -trimpath -buildvcs=false -p=${PROFLOW_PEERS_BUILD_JOBS:-2}" \
        ${GONOSUMDB_EXTRA:+GONOSUMDB="$GONOSUMDB_EXTRA"} \
        go build -ldflags="-s -w" -o "$out/" "${pkgs[@]}") >"$buildlog" 2>&1; then
    cat "$buildlog" >&2
    mkdir -p "$cache_root/failed-builds"
    cp -f "$buildlog" "$cache_root/failed-builds/$peer.log"
    rm -rf "$out"
    die "$peer: go build ${pkgs[*]} failed (log above, also in $cache_root/failed-builds/$peer.log)"
  fi
  local name parent
  for spec in "${todo[@]}"; do
    IFS='|' read -r dest pkg bin <<<"$spec"
    name="${pkg##*/}"
    if [[ $name =~ ^v([2-9]|[1-9][0-9]+)$ ]]; then parent="${pkg%/*}"; name="${parent##*/}"; fi
    [[ -x "$out/$name" ]] || { rm -rf "$out"; die "$peer: go build of $pkg left no binary $out/$name"; }
    mkdir -p "$dest/bin"
    mv -f "$out/$name" "$dest/bin/$bin"
    cp -f "$buildlog" "$dest/build.log"
    printf '%s' "$digest" >"$dest/.proflow-built"
  done
  rm -rf "$out"
  log "$peer: built ${#todo[@]} binaries in $((SECONDS - started))s"
}

# go_mod_version WRAPPER_DIR MODULE: the version of MODULE required in go.mod.
go_mod_version() {
  awk -v m="$2" '($1 == m || ($1 == "require" && $2 == m)) { print ($1 == m ? $2 : $3); exit }' "$1/go.mod"
}

# start_bg PEER CMD...: runs CMD detached in its own session (so `down` can kill
# its whole process group), in the peer's data dir, output to its log. No file
# descriptor of ours is inherited: a caller reading our stdout must see EOF
# when `up` exits, and our lock fds must not outlive us.
start_bg() {
  local peer="$1"; shift
  local dir; dir="$(run_dir "$peer")"
  (
    cd "$dir/data"
    exec setsid "$@" </dev/null >>"$dir/peer.log" 2>&1 8>&- 9>&-
  ) &
  printf '%s' "$!" >"$dir/pid"
}

peer_pid() { cat "$(run_dir "$1")/pid" 2>/dev/null; }

# peer_alive PEER: its process exists and is not a zombie awaiting reaping.
peer_alive() {
  local pid state
  pid="$(peer_pid "$1")"
  [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null || return 1
  state="$(ps -o stat= -p "$pid" 2>/dev/null)" || return 1
  [[ "$state" != Z* ]]
}

# wait_ready PEER TIMEOUT_S [quiet]: polls ready_PEER until it succeeds; fails
# early if the process died, and late after TIMEOUT_S, printing the log tail
# either way.
wait_ready() {
  local peer="$1" timeout="$2" quiet="${3:-}" started=$SECONDS
  while true; do
    if ! peer_alive "$peer"; then
      show_log_tail "$peer"
      log "$peer: the process exited before it was ready (log above)"
      return 1
    fi
    if "ready_$peer" 2>/dev/null; then
      [[ -n "$quiet" ]] || log "$peer: ready after $((SECONDS - started))s"
      return 0
    fi
    if (( SECONDS - started >= timeout )); then
      show_log_tail "$peer"
      log "$peer: not ready after ${timeout}s (log above)"
      return 1
    fi
    sleep 0.5
  done
}

show_log_tail() {
  local f; f="$(run_dir "$1")/peer.log"
  {
    printf -- '----- %s: last lines of %s -----\n' "$1" "$f"
    tail -n "${PROFLOW_PEERS_LOG_LINES:-60}" "$f" 2>/dev/null || true
    printf -- '----- end of %s log -----\n' "$1"
  } >&2
}

# halt_peer PEER SIGNAL GRACE_S: sends SIGNAL (TERM, KILL, ...) to the peer's
# process group and waits up to GRACE_S seconds for its process to end; then
# kills the group. Keeps the run dir (data, ports, log).
halt_peer() {
  local peer="$1" signal="$2" grace="$3" pid i
  pid="$(peer_pid "$peer")"
  [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null || return 0
  kill "-$signal" -- "-$pid" 2>/dev/null || kill "-$signal" "$pid" 2>/dev/null || true
  for ((i = 0; i < grace * 10; i++)); do
    peer_alive "$peer" || break
    sleep 0.1
  done
  if peer_alive "$peer"; then
    log "$peer: did not stop within ${grace}s of $signal; killing"
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do
      peer_alive "$peer" || break
      sleep 0.1
    done
  fi
  # Children of the group that outlived its leader go too.
  kill -KILL -- "-$pid" 2>/dev/null || true
}

# stop_peer PEER: kills the peer's process group (TERM, then KILL after a grace
# period) and removes its run dir with all its data.
stop_peer() {
  local peer="$1" dir
  dir="$(run_dir "$peer")"
  [[ -d "$dir" ]] || return 0
  halt_peer "$peer" TERM 10
  rm -rf "$dir"
}

# endpoint PORT: "127.0.0.1:PORT" (every peer binds loopback only)
endpoint() { printf '127.0.0.1:%s' "$1"; }

# ---------------------------------------------------------------------------
# Probes shared by several peers

http_ok() { curl -fsS -o /dev/null --max-time 2 "$@"; }

# go_app_bin NAME: builds tests/peers/apps/NAME (a small Go module of ours) into
# the cache, keyed by a digest of its sources, and prints the binary's path.
go_app_bin() {
  local name="$1" src="$peers_dir/apps/$1" digest home
  digest="$(cd "$src" && files_digest $(find . -type f \( -name '*.go' -o -name go.mod -o -name go.sum \) | LC_ALL=C sort))"
  home="$cache_root/go-app-$name-$digest"
  if [[ ! -x "$home/$name" ]]; then
    command -v go >/dev/null || die "$name: 'go' is not on PATH"
    log "$name: building tests/peers/apps/$name"
    mkdir -p "$home"
    (cd "$src" && with_install_lock "go-app-$name" nice -n "${PROFLOW_PEERS_NICE:-19}" env \
        GOFLAGS="-mod=readonly -trimpath -buildvcs=false" go build -o "$home/$name.tmp" .) >"$home/build.log" 2>&1 \
      || { cat "$home/build.log" >&2; die "$name: go build failed (log above)"; }
    mv -f "$home/$name.tmp" "$home/$name"
  fi
  printf '%s' "$home/$name"
}
