// Command gatekeeper-demo runs Gatekeeper's real gate and retry path
// (worker.Pipeline, the wiring of `gatekeeper run`) over synthetic
// traffic of a few tenants, on an embedded Kafka-protocol broker (franz-go's
// kfake) and an embedded Redis (miniredis), or on the servers named by
// GATEKEEPER_KAFKA_BROKERS and GATEKEEPER_REDIS_ADDRS when set. It shows a
// live view, then a summary that checks every limit held and nothing was
// lost.
//
// Usage:
//
//	gatekeeper-demo [-duration 30s] [-plain]
//
// It is a command of its own so that the shipped gatekeeper binary links no
// embedded servers.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := demoCmd(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
