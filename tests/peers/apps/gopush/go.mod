module proflow.test/peers/apps/gopush

go 1.25.0

require github.com/grafana/pyroscope-go v1.4.3

require (
	github.com/grafana/pyroscope-go/godeltaprof v0.1.11 // indirect
	github.com/klauspost/compress v1.18.7 // indirect
)
