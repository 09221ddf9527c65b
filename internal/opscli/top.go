package opscli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/gatekeeper-dev/gatekeeper/internal/worker"
)

// TopUsage is the help of `gatekeeper top`.
const TopUsage = `Usage:
  gatekeeper top [--count 20] [--sort deferred|rejected|admitted|waiting] [--interval 1s] [--once]
In a terminal it refreshes until Ctrl-C, like top; otherwise (or with --once)
it prints once. The API: GATEKEEPER_URL, token GATEKEEPER_TOKEN (read scope).
`

// Top runs `gatekeeper top ARGS`; terminal says whether stdout is a
// terminal. It returns the exit status.
func Top(ctx context.Context, args []string, stdout, stderr io.Writer, terminal bool) int {
	fs := flag.NewFlagSet("gatekeeper top", flag.ContinueOnError)
	fs.SetOutput(stderr)
	count := fs.Int("count", 20, "tenants per window")
	sort := fs.String("sort", "deferred", "deferred, rejected, admitted or waiting")
	interval := fs.Duration("interval", time.Second, "refresh interval in a terminal")
	once := fs.Bool("once", false, "print once, even in a terminal")
	if err := fs.Parse(args); err != nil || fs.NArg() > 0 || *interval < 100*time.Millisecond {
		fmt.Fprint(stderr, TopUsage)
		return 2
	}
	c := newClient()
	path := "/v1/tenants/top?" + url.Values{"count": {strconv.Itoa(*count)}, "sort": {*sort}}.Encode()
	fetch := func() (worker.TopResponse, error) {
		var out worker.TopResponse
		err := c.do(ctx, "GET", path, nil, &out)
		return out, err
	}
	if !terminal || *once {
		t, err := fetch()
		if err != nil {
			fmt.Fprintf(stderr, "gatekeeper top: %s\n", worker.OneLine(err.Error()))
			return 1
		}
		renderTop(stdout, t, time.Now(), 0)
		return 0
	}
	// The alternate screen, restored on exit; home and clear at each frame.
	fmt.Fprint(stdout, "\x1b[?1049h\x1b[?25l")
	defer fmt.Fprint(stdout, "\x1b[?25h\x1b[?1049l")
	tick := time.NewTicker(*interval)
	defer tick.Stop()
	for {
		var b strings.Builder
		b.WriteString("\x1b[H\x1b[2J")
		if t, err := fetch(); err != nil {
			fmt.Fprintf(&b, "gatekeeper top: %s (retrying every %v; Ctrl-C quits)\n", worker.OneLine(err.Error()), *interval)
		} else {
			renderTop(&b, t, time.Now(), *interval)
		}
		io.WriteString(stdout, b.String())
		select {
		case <-ctx.Done():
			return 0
		case <-tick.C:
		}
	}
}

// renderTop writes the view: a header line, then the current and the last
// window's tables.
func renderTop(w io.Writer, t worker.TopResponse, now time.Time, every time.Duration) {
	refresh := "once"
	if every > 0 {
		refresh = "every " + every.String() + ", Ctrl-C quits"
	}
	fmt.Fprintf(w, "gatekeeper top - %s - replicas %d - window %s - sorted by %s - %s\n",
		now.UTC().Format("15:04:05"), t.Replicas, t.Window, t.Sort, refresh)
	for _, x := range []struct {
		name string
		tab  worker.TopTable
	}{{"current", t.Current}, {"last", t.Last}} {
		fmt.Fprintf(w, "\n%s window from %s\n", x.name, x.tab.Start.UTC().Format(time.RFC3339))
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "TENANT\tADMITTED\tDEFERRED\tREJECTED\tWAITING\tRULES\tOVERRIDE\t")
		for _, r := range x.tab.Rows {
			ov := "-"
			if r.Override != nil {
				ov = fmt.Sprintf("v%d", r.Override.Version)
				if r.Override.Shadow {
					ov += fmt.Sprintf(" shadow %s (would defer %d, reject %d)", r.Override.RulesText(), r.ShadowDeferred, r.ShadowRejected)
				}
				if !r.Override.Shadow && r.Override.HasShare() {
					ov += " " + r.Override.RulesText()
				}
				if r.Override.Expires != nil {
					ov += " until " + r.Override.Expires.UTC().Format("15:04:05")
				}
			}
			rules := "none"
			if len(r.Rules) > 0 {
				rules = strings.Join(r.Rules, ",")
			}
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%s\t%s\t\n", safe(r.Tenant), r.Admitted, r.Deferred, r.Rejected, r.Waiting, rules, ov)
		}
		if o := x.tab.Other; o.Admitted+o.Deferred+o.Rejected > 0 {
			fmt.Fprintf(tw, "(others)\t%d\t%d\t%d\t\t\t\t\n", o.Admitted, o.Deferred, o.Rejected)
		}
		tw.Flush()
	}
}

// safe keeps control characters of a tenant name off the terminal.
func safe(s string) string {
	return strings.Map(func(r rune) rune {
		if r < ' ' || r == 0x7f {
			return '?'
		}
		return r
	}, s)
}
