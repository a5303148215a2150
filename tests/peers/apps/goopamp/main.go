// goopamp: an OpAMP server on opamp-go's server package, for
// tests/opamp.rs. It serves OpAMP (WebSocket and plain HTTP) at
// http://<-listen>/v1/opamp and, on -control, what the tests drive:
//
//	GET  /agents   every agent seen, latest state first merged in, as JSON
//	POST /config   the body becomes the remote config offered to every
//	               agent: pushed at once over WebSocket, answered on the
//	               next poll over plain HTTP
//
// With -require-header "Name: value" it refuses (401) a connection
// without that header; with -cert and -key it serves OpAMP over TLS.
package main

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"flag"
	"io"
	"log"
	"net/http"
	"strings"
	"sync"

	"github.com/open-telemetry/opamp-go/protobufs"
	"github.com/open-telemetry/opamp-go/server"
	"github.com/open-telemetry/opamp-go/server/types"
)

type component struct {
	Healthy    bool                 `json:"healthy"`
	Status     string               `json:"status"`
	LastError  string               `json:"last_error"`
	Components map[string]component `json:"components,omitempty"`
}

type agent struct {
	UID             string            `json:"uid"`
	Transport       string            `json:"transport"`
	Connected       bool              `json:"connected"`
	Connections     int               `json:"connections"`
	Messages        int               `json:"messages"`
	Identifying     map[string]string `json:"identifying"`
	NonIdentifying  map[string]string `json:"non_identifying"`
	Capabilities    uint64            `json:"capabilities"`
	Health          *component        `json:"health"`
	EffectiveConfig string            `json:"effective_config"`
	RemoteStatus    string            `json:"remote_status"`
	RemoteHash      string            `json:"remote_hash"`
	RemoteError     string            `json:"remote_error"`
	Disconnected    bool              `json:"said_goodbye"`
	conn            types.Connection
}

var (
	mu     sync.Mutex
	agents = map[string]*agent{}
	remote *protobufs.AgentRemoteConfig
)

func health(h *protobufs.ComponentHealth) component {
	c := component{Healthy: h.Healthy, Status: h.Status, LastError: h.LastError}
	if len(h.ComponentHealthMap) > 0 {
		c.Components = map[string]component{}
		for k, v := range h.ComponentHealthMap {
			c.Components[k] = health(v)
		}
	}
	return c
}

func attrs(kvs []*protobufs.KeyValue) map[string]string {
	m := map[string]string{}
	for _, kv := range kvs {
		m[kv.Key] = kv.Value.GetStringValue()
	}
	return m
}

func onMessage(transport string) func(context.Context, types.Connection, *protobufs.AgentToServer) *protobufs.ServerToAgent {
	return func(_ context.Context, conn types.Connection, msg *protobufs.AgentToServer) *protobufs.ServerToAgent {
		mu.Lock()
		defer mu.Unlock()
		uid := hex.EncodeToString(msg.InstanceUid)
		a := agents[uid]
		if a == nil {
			a = &agent{UID: uid}
			agents[uid] = a
		}
		a.Transport, a.Messages, a.Connected = transport, a.Messages+1, true
		if transport == "ws" {
			a.conn = conn
		}
		if d := msg.AgentDescription; d != nil {
			a.Identifying, a.NonIdentifying = attrs(d.IdentifyingAttributes), attrs(d.NonIdentifyingAttributes)
		}
		a.Capabilities = msg.Capabilities
		if msg.Health != nil {
			h := health(msg.Health)
			a.Health = &h
		}
		if e := msg.EffectiveConfig; e != nil && e.ConfigMap != nil {
			if f := e.ConfigMap.ConfigMap[""]; f != nil {
				a.EffectiveConfig = string(f.Body)
			}
		}
		if s := msg.RemoteConfigStatus; s != nil {
			a.RemoteStatus = s.Status.String()
			a.RemoteHash = hex.EncodeToString(s.LastRemoteConfigHash)
			a.RemoteError = s.ErrorMessage
		}
		if msg.AgentDisconnect != nil {
			a.Disconnected = true
		}
		answer := &protobufs.ServerToAgent{InstanceUid: msg.InstanceUid}
		if a.Identifying == nil {
			answer.Flags = uint64(protobufs.ServerToAgentFlags_ServerToAgentFlags_ReportFullState)
		}
		if remote != nil && a.RemoteHash != hex.EncodeToString(remote.ConfigHash) {
			answer.RemoteConfig = remote
		}
		return answer
	}
}

func main() {
	listen := flag.String("listen", "127.0.0.1:4320", "OpAMP address")
	control := flag.String("control", "127.0.0.1:4321", "control address")
	require := flag.String("require-header", "", "Name: value every connection must carry")
	certFile := flag.String("cert", "", "PEM certificate: serve OpAMP over TLS (wss, https)")
	keyFile := flag.String("key", "", "PEM key of -cert")
	flag.Parse()

	srv := server.New(nil)
	settings := server.StartSettings{
		ListenEndpoint: *listen,
		Settings: server.Settings{Callbacks: types.Callbacks{
			OnConnecting: func(r *http.Request) types.ConnectionResponse {
				if name, value, ok := strings.Cut(*require, ":"); ok && r.Header.Get(strings.TrimSpace(name)) != strings.TrimSpace(value) {
					return types.ConnectionResponse{Accept: false, HTTPStatusCode: http.StatusUnauthorized}
				}
				transport := "http"
				if strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
					transport = "ws"
				}
				return types.ConnectionResponse{Accept: true, ConnectionCallbacks: types.ConnectionCallbacks{
					OnConnected: func(context.Context, types.Connection) {},
					OnMessage:   onMessage(transport),
					OnConnectionClose: func(conn types.Connection) {
						if transport != "ws" {
							return
						}
						mu.Lock()
						defer mu.Unlock()
						for _, a := range agents {
							if a.conn == conn {
								a.Connected, a.conn = false, nil
								a.Connections++
							}
						}
					},
				}}
			},
		}},
	}
	if *certFile != "" {
		cert, err := tls.LoadX509KeyPair(*certFile, *keyFile)
		if err != nil {
			log.Fatalf("TLS: %v", err)
		}
		settings.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}}
	}
	if err := srv.Start(settings); err != nil {
		log.Fatalf("start: %v", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/agents", func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		list := []*agent{}
		for _, a := range agents {
			list = append(list, a)
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(list)
	})
	mux.HandleFunc("/config", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		sum := sha256.Sum256(body)
		mu.Lock()
		remote = &protobufs.AgentRemoteConfig{
			Config: &protobufs.AgentConfigMap{ConfigMap: map[string]*protobufs.AgentConfigFile{
				"": {Body: body, ContentType: "text/yaml"},
			}},
			ConfigHash: sum[:],
		}
		var conns []types.Connection
		var uids [][]byte
		for uid, a := range agents {
			if a.conn != nil {
				raw, _ := hex.DecodeString(uid)
				conns, uids = append(conns, a.conn), append(uids, raw)
			}
		}
		offer := remote
		mu.Unlock()
		for i, c := range conns {
			_ = c.Send(r.Context(), &protobufs.ServerToAgent{InstanceUid: uids[i], RemoteConfig: offer})
		}
		_, _ = io.WriteString(w, hex.EncodeToString(sum[:])+"\n")
	})
	log.Printf("OpAMP on %s/v1/opamp, control on %s", *listen, *control)
	log.Fatal(http.ListenAndServe(*control, mux))
}
