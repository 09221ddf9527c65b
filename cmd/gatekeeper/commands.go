package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
	"github.com/gatekeeper-dev/gatekeeper/internal/override"
	"github.com/gatekeeper-dev/gatekeeper/internal/route"
	"github.com/gatekeeper-dev/gatekeeper/internal/worker"
)

// loadConfig reads and validates the configuration; tests replace it.
var loadConfig = worker.LoadConfig

// errInterrupted is the error of a configuration read cut short by SIGINT
// or SIGTERM.
var errInterrupted = errors.New("gatekeeper: interrupted while reading the configuration")

// loadConfigCtx reads the configuration, or gives up when ctx is done
// (SIGINT, SIGTERM): reading LIMITS_FILE could block on a file system that
// does not answer, and signals must still stop the process. The read left
// behind ends with the process.
func loadConfigCtx(ctx context.Context) (*worker.Config, error) {
	type result struct {
		cfg *worker.Config
		err error
	}
	load := loadConfig
	done := make(chan result, 1)
	go func() {
		cfg, err := load()
		done <- result{cfg, err}
	}()
	select {
	case r := <-done:
		return r.cfg, r.err
	case <-ctx.Done():
		return nil, errInterrupted
	}
}

// checkConfigCmd prints the effective configuration, masked, as
// GATEKEEPER_X=value lines, and the configuration's warnings on stderr.
// SIGINT and SIGTERM (ctx) stop it.
func checkConfigCmd(ctx context.Context, stdout, stderr io.Writer) int {
	cfg, err := loadConfigCtx(ctx)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	lines, err := cfg.Masked().Environ()
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	if unknown, _ := worker.UnknownVars(os.Environ()); len(unknown) > 0 {
		fmt.Fprintf(stderr, "warning: not Gatekeeper variables (typos?): %s\n", strings.Join(unknown, ", "))
	}
	for _, w := range cfg.Warnings() {
		fmt.Fprintf(stderr, "warning: %s\n", w)
	}
	for _, l := range lines {
		fmt.Fprintln(stdout, l)
	}
	return 0
}

// usageCmd prints a tenant's usage, read from Redis, as the usage API would.
// It reads only the Redis variables and the rules (worker.LoadUsageConfig).
func usageCmd(ctx context.Context, tenant string, stdout, stderr io.Writer) int {
	cfg, err := worker.LoadUsageConfig()
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	if tenant == "" || len(tenant) > route.MaxTenantBytes {
		fmt.Fprintf(stderr, "gatekeeper usage: tenant must be 1 to %d bytes\n", route.MaxTenantBytes)
		return 2
	}
	rules, err := cfg.Rules()
	if err != nil {
		fmt.Fprintln(stderr, worker.OneLine(err.Error()))
		return 1
	}
	rdb, err := worker.NewRedis(ctx, cfg)
	if err != nil {
		fmt.Fprintf(stderr, "gatekeeper usage: %s\n", worker.OneLine(err.Error()))
		return 1
	}
	defer rdb.Close()
	opts, err := worker.LimiterOptions(cfg, nil)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	// The tenant's live override, if any, as the replicas enforce it.
	store, err := override.NewStore(ctx, rdb, override.StoreOptions{Prefix: cfg.RedisKeyPrefix, Timeout: cfg.RedisTimeout})
	if err == nil {
		rules, err = store.Layer(ctx, rules, tenant)
	}
	if err != nil {
		fmt.Fprintf(stderr, "gatekeeper usage: overrides: %s\n", worker.OneLine(err.Error()))
		return 1
	}
	lim, err := limit.New(ctx, rdb, rules, opts)
	if err != nil {
		fmt.Fprintf(stderr, "gatekeeper usage: start limiter: %s\n", worker.OneLine(err.Error()))
		return 1
	}
	usage, err := lim.Usage(ctx, tenant)
	if err != nil {
		fmt.Fprintf(stderr, "gatekeeper usage: %s\n", worker.OneLine(err.Error()))
		return 1
	}
	if usage == nil {
		usage = []limit.Usage{}
	}
	shares, err := lim.CapacityUsage(ctx, tenant)
	if err != nil {
		fmt.Fprintf(stderr, "gatekeeper usage: %s\n", worker.OneLine(err.Error()))
		return 1
	}
	enc := json.NewEncoder(stdout)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(worker.UsageResponse{Tenant: tenant, Rules: usage, Capacity: shares}); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	return 0
}

// runCmd runs the worker until ctx is done (SIGINT, SIGTERM) or it fails.
// A bad configuration is one line on stderr and status 1.
func runCmd(ctx context.Context, stderr io.Writer) int {
	cfg, err := loadConfigCtx(ctx)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	log, err := worker.NewLogger(stderr, cfg.LogLevel)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	done := make(chan error, 1)
	go func() { done <- worker.Serve(ctx, cfg, log, version) }()
	var serr error
	select {
	case serr = <-done:
	case <-ctx.Done():
		log.Info("stopping", slog.String("grace", cfg.ShutdownGrace.String()))
		select {
		case serr = <-done:
		case <-time.After(cfg.ShutdownGrace):
			log.Error("shutdown grace exceeded, exiting with work unfinished", slog.String("grace", cfg.ShutdownGrace.String()))
			return 1
		}
	}
	if serr != nil {
		log.Error("gatekeeper stopped", slog.String("err", worker.OneLine(serr.Error())))
		return 1
	}
	log.Info("stopped")
	return 0
}
