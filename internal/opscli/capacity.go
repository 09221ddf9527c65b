package opscli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/gatekeeper-dev/gatekeeper/internal/worker"
)

// CapacityUsage is the help of `gatekeeper capacity`.
const CapacityUsage = `Usage:
  gatekeeper capacity                         the capacity in force, the paced rate, the cap and its audit
  gatekeeper capacity cap RATE --for 15m --reason WHY
      RATE in CAPACITY's measure a second ("500"; bytes or units for such a capacity) or as CAPACITY
      ("30000/1m", "1MiB/1s"); or --until 2026-12-01T23:00:00Z
  gatekeeper capacity lift --reason WHY       remove the cap
The API: GATEKEEPER_URL (default http://localhost:8080), token GATEKEEPER_TOKEN.
`

// Capacity runs `gatekeeper capacity ARGS` and returns the exit status:
// 0 done, 1 failed, 2 bad usage.
func Capacity(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cmd := "show"
	if len(args) > 0 {
		cmd, args = args[0], args[1:]
	}
	fs := flag.NewFlagSet("gatekeeper capacity "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	reason := fs.String("reason", "", "why (kept in the audit)")
	dur := fs.Duration("for", 0, "the cap lasts this long")
	until := fs.String("until", "", "the cap lasts until this time (RFC 3339)")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return 2
	}
	c := newClient()
	var runErr error
	switch {
	case cmd == "show" && len(pos) == 0:
		var v worker.CapacityView
		if runErr = c.do(ctx, "GET", "/v1/capacity", nil, &v); runErr == nil {
			printJSON(stdout, v)
		}
	case cmd == "cap" && len(pos) == 1:
		body := worker.CapacityCap{Reason: *reason}
		if x, err := strconv.ParseFloat(pos[0], 64); err == nil {
			body.Rate = x
		} else {
			body.Capacity = pos[0]
		}
		if *dur != 0 {
			body.For = dur.String()
		}
		if *until != "" {
			t, err := time.Parse(time.RFC3339, *until)
			if err != nil {
				fmt.Fprintf(stderr, "gatekeeper capacity cap: --until %q is not an RFC 3339 time\n", *until)
				return 2
			}
			body.Until = &t
		}
		var out map[string]any
		if runErr = c.do(ctx, "PUT", "/v1/capacity/cap", body, &out); runErr == nil {
			printJSON(stdout, out)
		}
	case cmd == "lift" && len(pos) == 0:
		var out map[string]any
		if runErr = c.do(ctx, "DELETE", "/v1/capacity/cap", worker.CapacityCap{Reason: *reason}, &out); runErr == nil {
			printJSON(stdout, out)
		}
	default:
		fmt.Fprintf(stderr, "gatekeeper capacity %s: wrong arguments\n\n%s", cmd, CapacityUsage)
		return 2
	}
	if runErr != nil {
		fmt.Fprintf(stderr, "gatekeeper capacity %s: %s\n", cmd, worker.OneLine(runErr.Error()))
		return 1
	}
	return 0
}
