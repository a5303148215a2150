# shellcheck shell=bash
# Apache Kafka, single KRaft node (broker + controller), jars from Maven Central
# via pom.xml beside this file, run with the machine's Java (17+).
# Prints KAFKA_ENDPOINT=host:port (the PLAINTEXT broker listener).
#
# Private brokers of tests that need authentication or TLS
# (tests/kafka_security.rs) take three more variables; `up` never sets them,
# and unset they change nothing:
#   PROFLOW_KAFKA_LISTENERS   more broker listeners, space-separated NAME:PROTOCOL
#                             (PROTOCOL: SASL_PLAINTEXT, SSL, SASL_SSL), each on a
#                             port of its own, printed as KAFKA_<NAME>_ENDPOINT.
#                             PLAINTEXT stays, for the controller and the probe.
#   PROFLOW_KAFKA_PROPERTIES  lines appended to server.properties, such as
#                             listener.name.<name>.ssl.keystore.location=...
#   PROFLOW_KAFKA_SCRAM       SCRAM credentials written at format time (first
#                             start), one per line, each an --add-scram value:
#                             SCRAM-SHA-256=[name=alice,password=secret]

kafka_dir="$peers_dir/kafka"
kafka_version() { sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$kafka_dir/pom.xml"; }

install_kafka() {
  local dest; dest="$cache_root/kafka-$(kafka_version)"
  local stamp="$dest/.proflow-installed" digest
  digest="$(files_digest "$kafka_dir/pom.xml")"
  if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$digest" ]]; then
    command -v mvn >/dev/null || die "kafka: 'mvn' is not on PATH (Debian package maven)"
    log "kafka: fetching kafka_2.13 $(kafka_version) and its runtime dependencies into $dest/libs"
    rm -rf "$dest/libs"
    mkdir -p "$dest"
    if ! nice -n "${PROFLOW_PEERS_NICE:-19}" mvn -B -q -f "$kafka_dir/pom.xml" \
        dependency:copy-dependencies -Dkafka.libs="$dest/libs" >"$dest/install.log" 2>&1; then
      cat "$dest/install.log" >&2
      die "kafka: maven could not fetch the broker (log above)"
    fi
    printf '%s' "$digest" >"$stamp"
  fi
  # kcat is the readiness probe and the tests' consumer (tests/peers/kafka/consume).
  if ! command -v kcat >/dev/null; then
    if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
      log "kafka: installing kcat (Debian package)"
      DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 install -y -qq kcat >"$dest/apt.log" 2>&1 \
        || { cat "$dest/apt.log" >&2; die "kafka: apt-get install kcat failed (log above)"; }
    else
      die "kafka: kcat is not installed; install the Debian package kcat"
    fi
  fi
  command -v java >/dev/null || die "kafka: 'java' (17 or later) is not on PATH"
}

start_kafka() {
  local dir libs broker controller cluster_id ports spec name protocol i
  local extra_listeners="" extra_advertised="" extra_protocols="" extra_endpoints=""
  local -a specs scram_args=()
  dir="$(run_dir kafka)"
  libs="$cache_root/kafka-$(kafka_version)/libs"
  read -r -a specs <<<"${PROFLOW_KAFKA_LISTENERS:-}"
  read -r -a ports < <(peer_ports kafka $((2 + ${#specs[@]})))
  broker="${ports[0]}" controller="${ports[1]}"
  i=2
  for spec in "${specs[@]}"; do
    name="${spec%%:*}" protocol="${spec#*:}"
    [[ "$name" =~ ^[A-Z][A-Z0-9_]*$ && "$name" != PLAINTEXT && "$name" != CONTROLLER ]] \
      || die "kafka: PROFLOW_KAFKA_LISTENERS: '$name' is not a listener name (A-Z, 0-9, _; not PLAINTEXT or CONTROLLER)"
    case "$protocol" in SASL_PLAINTEXT | SSL | SASL_SSL) ;;
      *) die "kafka: PROFLOW_KAFKA_LISTENERS: '$spec' needs a protocol SASL_PLAINTEXT, SSL or SASL_SSL" ;;
    esac
    [[ -n "${ports[$i]:-}" ]] || die "kafka: $(run_dir kafka)/ports holds no port for listener $name (started before with fewer listeners?)"
    extra_listeners+=",$name://127.0.0.1:${ports[$i]}"
    extra_advertised+=",$name://127.0.0.1:${ports[$i]}"
    extra_protocols+=",$name:$protocol"
    extra_endpoints+="KAFKA_${name}_ENDPOINT=$(endpoint "${ports[$i]}")"$'\n'
    i=$((i + 1))
  done
  cat >"$dir/server.properties" <<PROPS
# Written by tests/peers/up: one node that is broker and controller (KRaft).
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$controller
listeners=PLAINTEXT://127.0.0.1:$broker,CONTROLLER://127.0.0.1:$controller$extra_listeners
advertised.listeners=PLAINTEXT://127.0.0.1:$broker$extra_advertised
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT$extra_protocols
log.dirs=$dir/data/kafka-logs
num.partitions=1
auto.create.topics.enable=true
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
PROPS
  if [[ -n "${PROFLOW_KAFKA_PROPERTIES:-}" ]]; then
    printf '# From PROFLOW_KAFKA_PROPERTIES:\n%s\n' "$PROFLOW_KAFKA_PROPERTIES" >>"$dir/server.properties"
  fi
  # Formatted once: a broker started again on the same log dir
  # (tests/peers/private) keeps its cluster id, topics and records.
  if [[ ! -f "$dir/data/kafka-logs/meta.properties" ]]; then
    # A base64url uuid may start with `-`, which the tool's argument parser
    # takes for an option: pass it as --cluster-id=VALUE.
    while IFS= read -r spec; do
      [[ -n "$spec" ]] && scram_args+=(--add-scram "$spec")
    done <<<"${PROFLOW_KAFKA_SCRAM:-}"
    cluster_id="$(python3 -c 'import base64, uuid; print(base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("="))')"
    if ! java -cp "$libs/*" -Dlog4j2.configurationFile="$kafka_dir/log4j2.properties" \
        kafka.tools.StorageTool format --cluster-id="$cluster_id" -c "$dir/server.properties" "${scram_args[@]}" \
        >"$dir/format.log" 2>&1; then
      cat "$dir/format.log" >&2
      die "kafka: formatting the KRaft storage failed (log above)"
    fi
  fi
  start_bg kafka java -Xms256m -Xmx${PROFLOW_KAFKA_HEAP:-768m} -XX:+UseG1GC -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$kafka_dir/log4j2.properties" \
    -cp "$libs/*" kafka.Kafka "$dir/server.properties"
  printf 'KAFKA_ENDPOINT=%s\n%s' "$(endpoint "$broker")" "$extra_endpoints" >"$dir/endpoints"
}

# Ready when a topic can be created (auto-created by the first produce) and a
# message produced to it can be consumed back.
ready_kafka() {
  local ep token got
  ep="$(sed -n 's/^KAFKA_ENDPOINT=//p' "$(run_dir kafka)/endpoints")"
  token="ready-$$-$RANDOM"
  kcat -b "$ep" -L -m 2 >/dev/null 2>&1 || return 1
  printf '%s\n' "$token" | kcat -b "$ep" -P -t proflow-ready -m 5 -X message.timeout.ms=4000 >/dev/null 2>&1 || return 1
  got="$(kcat -b "$ep" -C -t proflow-ready -o -1 -c 1 -e -m 5 -q 2>/dev/null)" || return 1
  [[ "$got" == "$token" ]]
}
