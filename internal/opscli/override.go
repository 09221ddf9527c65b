package opscli

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
	"github.com/gatekeeper-dev/gatekeeper/internal/override"
	"github.com/gatekeeper-dev/gatekeeper/internal/worker"
)

// OverrideUsage is the help of `gatekeeper override`.
const OverrideUsage = `Usage:
  gatekeeper override set TENANT RULES --reason WHY [--version N] [--expires 2h] [--shadow] [--dry-run]
      RULES as in LIMITS, comma-separated ("500/1m,20000/1d"), or "none" (not limited);
      with a capacity, weight:N and floor:N/1s items set the tenant's share ("500/1m,weight:3");
      share items alone keep the tenant's rules ("weight:3,floor:200/1s")
      --version: the tenant's current version (0: none); without it, read first
  gatekeeper override get TENANT
  gatekeeper override list
  gatekeeper override delete TENANT --reason WHY [--version N]
  gatekeeper override audit [TENANT] [--count 50]
The API: GATEKEEPER_URL (default http://localhost:8080), token GATEKEEPER_TOKEN.
`

// Override runs `gatekeeper override ARGS` and returns the exit status:
// 0 done, 1 failed (3: a stale write refused), 2 bad usage.
func Override(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, OverrideUsage)
		return 2
	}
	cmd, args := args[0], args[1:]
	fs := flag.NewFlagSet("gatekeeper override "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	reason := fs.String("reason", "", "why (kept in the audit)")
	version := fs.Int64("version", -1, "the tenant's current version (0: none)")
	expires := fs.Duration("expires", 0, "end the override after this long")
	shadow := fs.Bool("shadow", false, "count and report, do not enforce")
	dryRun := fs.Bool("dry-run", false, "show the tenant's usage under the new rules; write nothing")
	count := fs.Int("count", 50, "audit entries")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return 2
	}
	c := newClient()
	var runErr error
	switch {
	case cmd == "set" && len(pos) == 2:
		runErr = c.set(ctx, stdout, stderr, pos[0], pos[1], *reason, *version, *expires, *shadow, *dryRun)
	case cmd == "get" && len(pos) == 1:
		var v worker.OverrideView
		if runErr = c.do(ctx, "GET", "/v1/overrides/"+url.PathEscape(pos[0]), nil, &v); runErr == nil {
			printJSON(stdout, v)
		}
	case cmd == "list" && len(pos) == 0:
		runErr = c.list(ctx, stdout)
	case cmd == "delete" && len(pos) == 1:
		runErr = c.delete(ctx, stdout, stderr, pos[0], *reason, *version)
	case cmd == "audit" && len(pos) <= 1:
		tenant := ""
		if len(pos) == 1 {
			tenant = pos[0]
		}
		runErr = c.audit(ctx, stdout, tenant, *count)
	default:
		fmt.Fprintf(stderr, "gatekeeper override %s: wrong arguments\n\n%s", cmd, OverrideUsage)
		return 2
	}
	if runErr != nil {
		fmt.Fprintf(stderr, "gatekeeper override %s: %s\n", cmd, worker.OneLine(runErr.Error()))
		if isStale(runErr) {
			return 3
		}
		return 1
	}
	return 0
}

// parseInterleaved parses flags anywhere among the positional arguments.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

func printJSON(w io.Writer, v any) {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// currentVersion reads the tenant's version (0: no override).
func (c *client) currentVersion(ctx context.Context, tenant string) (int64, error) {
	var v worker.OverrideView
	if err := c.do(ctx, "GET", "/v1/overrides/"+url.PathEscape(tenant), nil, &v); err != nil {
		return 0, err
	}
	if v.Override == nil {
		return 0, nil
	}
	return v.Override.Version, nil
}

func (c *client) set(ctx context.Context, stdout, stderr io.Writer, tenant, rules, reason string, version int64, expires time.Duration, shadow, dryRun bool) error {
	var rec override.Record
	if err := rec.SetRulesText(rules); err != nil {
		return err
	}
	body := worker.OverrideWrite{Reason: reason, Shadow: shadow, DryRun: dryRun, Rules: rec.Rules,
		KeepRules: rec.KeepRules, Weight: rec.Weight, Floors: rec.Floors}
	if expires > 0 {
		body.ExpiresIn = expires.String()
	}
	if version < 0 {
		v, err := c.currentVersion(ctx, tenant)
		if err != nil {
			return err
		}
		version = v
		fmt.Fprintf(stderr, "current version %d (pass --version to guard against a concurrent change)\n", v)
	}
	body.Version = &version
	if dryRun {
		var out worker.DryRun
		if err := c.do(ctx, "PUT", "/v1/overrides/"+url.PathEscape(tenant), body, &out); err != nil {
			return err
		}
		printDryRun(stdout, out)
		return nil
	}
	var out override.Record
	if err := c.do(ctx, "PUT", "/v1/overrides/"+url.PathEscape(tenant), body, &out); err != nil {
		return err
	}
	printJSON(stdout, out)
	return nil
}

func printDryRun(w io.Writer, d worker.DryRun) {
	fmt.Fprintf(w, "dry run for %s (nothing written; current version %d)\n", d.Tenant, d.Current)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "\tRULE\tCOUNT\tLIMIT\tREMAINING\tRESET")
	for _, x := range []struct {
		name string
		us   any
	}{{"now", d.Before}, {"new", d.After}} {
		b, _ := json.Marshal(x.us)
		var rows []struct {
			Rule      string    `json:"rule"`
			Count     int64     `json:"count"`
			Limit     int64     `json:"limit"`
			Remaining int64     `json:"remaining"`
			Reset     time.Time `json:"reset"`
		}
		_ = json.Unmarshal(b, &rows)
		if len(rows) == 0 {
			fmt.Fprintf(tw, "%s\t(no rules: not limited)\t\t\t\t\n", x.name)
		}
		for _, r := range rows {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\n", x.name, r.Rule, r.Count, r.Limit, r.Remaining, r.Reset.UTC().Format(time.RFC3339))
		}
	}
	tw.Flush()
	if len(d.CapacityBefore) == 0 && len(d.CapacityAfter) == 0 {
		return
	}
	fmt.Fprintln(w, "\nshare of the capacity in its current window (entitlement: max(floor, weight x level), at the current level)")
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "\tCAPACITY\tWEIGHT\tFLOOR\tLEVEL\tENTITLEMENT\tBOOKED\tSHARE\tWAITING")
	for _, x := range []struct {
		name string
		cs   []limit.CapacityShare
	}{{"now", d.CapacityBefore}, {"new", d.CapacityAfter}} {
		for _, c := range x.cs {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%.1f\t%d\t%d\t%.3f\t%d\n", x.name, c.Capacity, c.Weight, c.Floor, c.Level, c.Entitlement, c.Booked, c.Share, c.Waiting)
		}
	}
	tw.Flush()
}

func (c *client) list(ctx context.Context, w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TENANT\tVERSION\tRULES\tSHADOW\tEXPIRES\tBY\tREASON")
	var cursor uint64
	for {
		var page worker.OverrideList
		if err := c.do(ctx, "GET", "/v1/overrides?count=500&cursor="+strconv.FormatUint(cursor, 10), nil, &page); err != nil {
			return err
		}
		for _, r := range page.Overrides {
			exp := "-"
			if r.Expires != nil {
				exp = r.Expires.UTC().Format(time.RFC3339)
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%v\t%s\t%s\t%s\n", r.Tenant, r.Version, r.RulesText(), r.Shadow, exp, r.By, r.Reason)
		}
		if cursor = page.NextCursor; cursor == 0 {
			break
		}
	}
	return tw.Flush()
}

func (c *client) delete(ctx context.Context, stdout, stderr io.Writer, tenant, reason string, version int64) error {
	if version < 0 {
		v, err := c.currentVersion(ctx, tenant)
		if err != nil {
			return err
		}
		version = v
		fmt.Fprintf(stderr, "current version %d (pass --version to guard against a concurrent change)\n", v)
	}
	var out map[string]any
	q := url.Values{"version": {strconv.FormatInt(version, 10)}, "reason": {reason}}
	if err := c.do(ctx, "DELETE", "/v1/overrides/"+url.PathEscape(tenant)+"?"+q.Encode(), nil, &out); err != nil {
		return err
	}
	printJSON(stdout, out)
	return nil
}

func (c *client) audit(ctx context.Context, w io.Writer, tenant string, count int) error {
	q := url.Values{"count": {strconv.Itoa(count)}}
	if tenant != "" {
		q.Set("tenant", tenant)
	}
	var out worker.AuditResponse
	if err := c.do(ctx, "GET", "/v1/audit?"+q.Encode(), nil, &out); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "AT\tVERSION\tTENANT\tOP\tBY\tBEFORE\tAFTER\tREASON")
	side := func(r *override.Record) string {
		if r == nil {
			return "-"
		}
		s := r.RulesText()
		if r.Shadow {
			s += " (shadow)"
		}
		if r.Expires != nil {
			s += " until " + r.Expires.UTC().Format(time.RFC3339)
		}
		return s
	}
	for _, e := range out.Entries {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", e.At.UTC().Format(time.RFC3339Nano), e.Version, e.Tenant, e.Op, e.By, side(e.Before), side(e.After), e.Reason)
	}
	return tw.Flush()
}
