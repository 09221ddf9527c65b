// Command gatekeeper is a Kafka consumer-group worker that throttles events
// per tenant: it forwards events within their tenant's limits (counted in
// Redis) to a downstream topic, defers the others to a retry topic until the
// tenant has room, and dead-letters what cannot be admitted.
//
// Usage:
//
//	gatekeeper [run]          run the worker (the default)
//	gatekeeper usage TENANT   print a tenant's current usage as JSON
//	gatekeeper override ...   set, get, list, delete live overrides; their audit
//	gatekeeper top            the tenants most deferred, rejected and admitted
//	gatekeeper capacity ...   the capacity in force; cap it until a time, lift the cap
//	gatekeeper check-config   print the effective configuration (secrets masked)
//	gatekeeper version        print the version
//	gatekeeper help           print this help and the configuration variables
//
// The demo is a command of its own, cmd/gatekeeper-demo, so that this binary
// links no embedded servers.
//
// It is configured only by GATEKEEPER_* environment variables; a bad value
// stops it with one line naming the variable and exit status 1.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"syscall"
	_ "time/tzdata" // TIMEZONE works in images without a zone database.

	"golang.org/x/term"

	"github.com/gatekeeper-dev/gatekeeper/internal/opscli"
	"github.com/gatekeeper-dev/gatekeeper/internal/worker"
)

// version is set at build time: -ldflags "-X main.version=v1.2.3".
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := realMain(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

const usageText = `gatekeeper throttles Kafka events per tenant, with counters in Redis.

Usage:
  gatekeeper [run]          run the worker (the default)
  gatekeeper usage TENANT   print a tenant's current usage as JSON (reads Redis;
                            needs only GATEKEEPER_REDIS_* and the rules)
  gatekeeper override ...   set, get, list, delete live overrides, read their audit
                            (gatekeeper override for its usage)
  gatekeeper top            the tenants most deferred, rejected and admitted
  gatekeeper capacity ...   the capacity in force and its pacing; cap it until a time
                            (gatekeeper capacity help for its usage)
  gatekeeper check-config   print the effective configuration, secrets masked;
                            exit 1 with one line naming a bad variable
  gatekeeper version        print the version
  gatekeeper help           print this help

Configuration is read from the environment only:
`

// realMain runs the subcommand in args (without the program name) and
// returns the exit status: 0 ok, 1 failure, 2 bad usage.
func realMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cmd := "run"
	if len(args) > 0 {
		cmd, args = args[0], args[1:]
	}
	wantArgs := func(n int, what string) bool {
		if len(args) == n {
			return true
		}
		fmt.Fprintf(stderr, "gatekeeper %s: want %s\n", cmd, what)
		return false
	}
	switch cmd {
	case "run":
		if !wantArgs(0, "no arguments") {
			return 2
		}
		return runCmd(ctx, stderr)
	case "usage":
		if !wantArgs(1, "one argument: gatekeeper usage TENANT") {
			return 2
		}
		return usageCmd(ctx, args[0], stdout, stderr)
	case "check-config":
		if !wantArgs(0, "no arguments") {
			return 2
		}
		return checkConfigCmd(ctx, stdout, stderr)
	case "override":
		return opscli.Override(ctx, args, stdout, stderr)
	case "capacity":
		return opscli.Capacity(ctx, args, stdout, stderr)
	case "top":
		return opscli.Top(ctx, args, stdout, stderr, isTerminal(stdout))
	case "version":
		fmt.Fprintln(stdout, versionString())
		return 0
	case "help", "-h", "-help", "--help":
		printUsage(stdout)
		return 0
	case "config-table": // hidden: the README's configuration table
		t, err := worker.ConfigTable()
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		fmt.Fprint(stdout, t)
		return 0
	}
	fmt.Fprintf(stderr, "gatekeeper: unknown command %q\n\n", cmd)
	printUsage(stderr)
	return 2
}

// isTerminal reports whether w is a terminal (gatekeeper top refreshes
// in place there).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

func printUsage(w io.Writer) {
	fmt.Fprint(w, usageText)
	_ = worker.WriteConfigList(w)
}

func versionString() string {
	s := fmt.Sprintf("gatekeeper %s (%s, %s/%s", version, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, kv := range bi.Settings {
			if kv.Key == "vcs.revision" && len(kv.Value) >= 12 {
				s += ", commit " + kv.Value[:12]
			}
		}
	}
	return s + ")"
}
