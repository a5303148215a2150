module proflow.test/peers/apps/goscrape

go 1.25.0

require (
	github.com/felixge/fgprof v0.9.5
	github.com/grafana/pyroscope-go/godeltaprof v0.1.12
)

require (
	github.com/google/pprof v0.0.0-20240227163752-401108e1b7e7 // indirect
	github.com/klauspost/compress v1.18.6 // indirect
)
