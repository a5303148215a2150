module proflow.test/peers/apps/goopamp

go 1.25.0

require github.com/open-telemetry/opamp-go v0.23.0

require (
	github.com/gorilla/websocket v1.5.3 // indirect
	google.golang.org/protobuf v1.36.11 // indirect
)
