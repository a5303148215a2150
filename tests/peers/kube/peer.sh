# shellcheck shell=bash
# A real Kubernetes API server: kube-apiserver of k8s.io/kubernetes and its
# kubectl, with etcd (go.etcd.io/etcd/server/v3), all built from the wrapper
# module beside this file (go.mod pins the release and points every k8s.io
# staging module at its published version). No kubelet, scheduler or
# controllers: tests create pods, endpoints and nodes and patch their status
# themselves. One process group: etcd in the background, the API server in
# front.
#
# The API server serves HTTPS on 127.0.0.1 with a certificate made here for
# 127.0.0.1 and localhost, authenticates a static admin token (group
# system:masters) and client certificates of its CA (a client certificate of
# user proflow-client in group system:masters is made with it), and
# authorizes with RBAC, so a ServiceAccount's token is held
# to its Roles (tests of the chart's RBAC). The ServiceAccount admission plugin
# is off: without the controller manager no namespace gets its `default`
# ServiceAccount, and pods would be refused.
#
# Prints
#   KUBE_ENDPOINT=127.0.0.1:PORT
#   KUBE_API=https://127.0.0.1:PORT
#   KUBE_TOKEN=<admin bearer token>
#   KUBE_CA_FILE=<PEM CA of the serving certificate>
#   KUBE_KUBECONFIG=<a kubeconfig with the three above>
#   KUBE_KUBECTL=<path of the kubectl built with it>
#   KUBE_CLIENT_CERT=<PEM client certificate the API server accepts (admin)>
#   KUBE_CLIENT_KEY=<its PEM key>
#   KUBE_ETCD_ENDPOINT=127.0.0.1:PORT (etcd's client URL, plain HTTP)

kube_dir="$peers_dir/kube"
kube_home() { printf '%s/kube-%s' "$cache_root" "$(go_mod_version "$kube_dir" k8s.io/kubernetes)"; }

install_kube() {
  local home; home="$(kube_home)"
  # One build directory per binary: each keeps its own stamp of the pin; the
  # three are built by one `go build`.
  build_go_tools kube "$kube_dir" \
    "$home/etcd|go.etcd.io/etcd/server/v3|etcd" \
    "$home/kube-apiserver|k8s.io/kubernetes/cmd/kube-apiserver|kube-apiserver" \
    "$home/kubectl|k8s.io/kubernetes/cmd/kubectl|kubectl"
}

start_kube() {
  local dir home api etcd_client etcd_peer token
  dir="$(run_dir kube)"
  home="$(kube_home)"
  read -r api etcd_client etcd_peer < <(peer_ports kube 3)
  mkdir -p "$dir/data/etcd" "$dir/pki"
  # Started again in the same run dir (tests/peers/private), it keeps its
  # certificates, token and etcd data: clients that knew it know it again.
  if [[ ! -s "$dir/pki/tokens.csv" ]]; then
    kube_pki "$dir/pki"
    token="$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
    printf '%s,proflow-admin,proflow-admin,"system:masters"\n' "$token" >"$dir/pki/tokens.csv"
  fi
  token="$(cut -d, -f1 "$dir/pki/tokens.csv")"
  # Made apart from kube_pki: run dirs made before it existed get one too.
  [[ -s "$dir/pki/client.crt" ]] || kube_client_cert "$dir/pki"
  # etcd fsyncs nothing here: the data is thrown away with the run dir.
  start_bg kube bash -c '
    "$1/etcd/bin/etcd" --name peer --data-dir "$2/data/etcd" \
      --listen-client-urls "http://127.0.0.1:$3" --advertise-client-urls "http://127.0.0.1:$3" \
      --listen-peer-urls "http://127.0.0.1:$4" --initial-advertise-peer-urls "http://127.0.0.1:$4" \
      --initial-cluster "peer=http://127.0.0.1:$4" --unsafe-no-fsync --log-level warn &
    exec "$1/kube-apiserver/bin/kube-apiserver" \
      --etcd-servers "http://127.0.0.1:$3" \
      --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$5" \
      --tls-cert-file "$2/pki/server.crt" --tls-private-key-file "$2/pki/server.key" \
      --token-auth-file "$2/pki/tokens.csv" --client-ca-file "$2/pki/ca.crt" \
      --authorization-mode RBAC \
      --service-account-issuer https://kubernetes.default.svc \
      --service-account-key-file "$2/pki/sa.pub" --service-account-signing-key-file "$2/pki/sa.key" \
      --service-cluster-ip-range 10.96.0.0/16 \
      --disable-admission-plugins ServiceAccount \
      --endpoint-reconciler-type none --profiling=false ${PROFLOW_KUBE_APISERVER_FLAGS:-}' \
    kube "$home" "$dir" "$etcd_client" "$etcd_peer" "$api"
  cat >"$dir/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: peer
  cluster:
    server: https://127.0.0.1:$api
    certificate-authority: $dir/pki/ca.crt
users:
- name: admin
  user:
    token: $token
contexts:
- name: peer
  context: {cluster: peer, user: admin}
current-context: peer
EOF
  {
    printf 'KUBE_ENDPOINT=%s\n' "$(endpoint "$api")"
    printf 'KUBE_API=https://%s\n' "$(endpoint "$api")"
    printf 'KUBE_TOKEN=%s\n' "$token"
    printf 'KUBE_CA_FILE=%s\n' "$dir/pki/ca.crt"
    printf 'KUBE_KUBECONFIG=%s\n' "$dir/kubeconfig"
    printf 'KUBE_KUBECTL=%s\n' "$home/kubectl/bin/kubectl"
    printf 'KUBE_CLIENT_CERT=%s\n' "$dir/pki/client.crt"
    printf 'KUBE_CLIENT_KEY=%s\n' "$dir/pki/client.key"
    printf 'KUBE_ETCD_ENDPOINT=%s\n' "$(endpoint "$etcd_client")"
  } >"$dir/endpoints"
}

# kube_pki DIR: a CA, the serving certificate it signs (127.0.0.1, localhost)
# and the ServiceAccount token signing key pair.
kube_pki() {
  local pki="$1"
  (
    cd "$pki"
    openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=proflow-test-ca \
      -keyout ca.key -out ca.crt 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -subj /CN=kube-apiserver \
      -keyout server.key -out server.csr 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc\n' >server.ext
    openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 \
      -extfile server.ext -out server.crt 2>/dev/null
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
  ) || die "kube: making the test certificates with openssl failed"
}

# kube_client_cert DIR: a client certificate of the CA in DIR for user
# proflow-client in group system:masters (client.crt, client.key).
kube_client_cert() {
  local pki="$1"
  (
    cd "$pki"
    openssl req -newkey rsa:2048 -nodes -subj /O=system:masters/CN=proflow-client \
      -keyout client.key -out client.csr 2>/dev/null
    printf 'extendedKeyUsage=clientAuth\n' >client.ext
    openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 \
      -extfile client.ext -out client.crt 2>/dev/null
  ) || die "kube: making the client certificate with openssl failed"
}

ready_kube() {
  local dir api token
  dir="$(run_dir kube)"
  api="$(sed -n 's/^KUBE_API=//p' "$dir/endpoints")"
  token="$(sed -n 's/^KUBE_TOKEN=//p' "$dir/endpoints")"
  [[ "$(curl -fsS --max-time 2 --cacert "$dir/pki/ca.crt" -H "Authorization: Bearer $token" "$api/readyz" 2>/dev/null)" == ok ]]
}
