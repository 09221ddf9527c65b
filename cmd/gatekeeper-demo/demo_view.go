package main

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// demoView prints the demo's progress: on a terminal a table redrawn in
// place (ANSI escapes), otherwise one plain line per call (the caller calls
// it about every 5s). It is used by one goroutine.
type demoView struct {
	out      io.Writer
	live     bool
	tenants  []demoTenant
	where    string
	names    demoNames
	horizon  time.Duration
	duration time.Duration
	logLines func() int // warnings logged so far, if known
	width    int        // terminal columns, if known

	drawn    int // lines of the last live frame
	closed   bool
	prev     demoSnapshot // for throughput
	lastRate string
}

const (
	ansiUp        = "\x1b[%dA"
	ansiClearLine = "\x1b[2K"
	ansiHideCur   = "\x1b[?25l"
	ansiShowCur   = "\x1b[?25h"
)

// draw shows the snapshot; phase says what the demo is doing.
func (v *demoView) draw(s demoSnapshot, phase string, elapsed time.Duration) {
	rate := v.rates(s)
	if !v.live {
		t := s.Total
		fmt.Fprintf(v.out, "%5.1fs %-8s offered %d, admitted %d, deferred %d, back from retry %d, dead-lettered %d, waiting %d | %s\n",
			elapsed.Seconds(), phase, t.Offered, t.Direct, t.Deferred, t.Back, t.Dead, t.Waiting, rate)
		return
	}
	var b strings.Builder
	if v.drawn == 0 {
		b.WriteString(ansiHideCur)
	} else {
		fmt.Fprintf(&b, ansiUp, v.drawn)
	}
	lines := v.frame(s, phase, elapsed, rate)
	for _, l := range lines {
		b.WriteString(ansiClearLine + l + "\n")
	}
	v.drawn = len(lines)
	io.WriteString(v.out, b.String())
}

// rates returns the throughput since the previous snapshot, over at least
// half a second (a shorter interval repeats the last figures).
func (v *demoView) rates(s demoSnapshot) string {
	p := v.prev
	dt := s.At.Sub(p.At).Seconds()
	if p.At.IsZero() {
		v.prev = s
		return "per second: -"
	}
	if dt < 0.5 {
		return v.lastRate
	}
	v.prev = s
	per := func(now, before int) float64 { return float64(now-before) / dt }
	v.lastRate = fmt.Sprintf("per second: offered %.0f, downstream %.0f, deferred %.0f, dead-lettered %.0f",
		per(s.Total.Offered, p.Total.Offered),
		per(s.Total.Direct+s.Total.Back, p.Total.Direct+p.Total.Back),
		per(s.Total.Deferred, p.Total.Deferred),
		per(s.Total.Dead, p.Total.Dead))
	return v.lastRate
}

const tableHead = "%-7s %-6s %8s %9s %9s %6s %6s %8s  %s"

// frame returns the lines of one live frame, each cut to the terminal's
// width so that redrawing in place never wraps.
func (v *demoView) frame(s demoSnapshot, phase string, elapsed time.Duration, rate string) []string {
	title := fmt.Sprintf("Gatekeeper demo  %3.0fs of %v  %s", elapsed.Seconds(), v.duration, phase)
	if phase == "traffic" {
		title += "  (Ctrl-C stops early)"
	}
	lines := []string{
		title,
		fmt.Sprintf("%s; deferral horizon %v", v.where, v.horizon),
		fmt.Sprintf("%s -> %s, retry %s, dlq %s", v.names.Source, v.names.Downstream, v.names.Retry, v.names.DLQ),
		"",
		fmt.Sprintf(tableHead, "tenant", "limit", "offered", "admitted", "deferred", "back", "dlq", "waiting", "next due"),
	}
	row := func(c tenantCounts) string {
		next := "-"
		if !c.NextDue.IsZero() {
			next = fmt.Sprintf("in %.1fs", max(0, c.NextDue.Sub(s.At).Seconds()))
		}
		return fmt.Sprintf(tableHead, c.Tenant, c.Rule, itoa(c.Offered), itoa(c.Direct), itoa(c.Deferred),
			itoa(c.Back), itoa(c.Dead), itoa(c.Waiting), next)
	}
	for _, c := range s.Tenants {
		lines = append(lines, row(c))
	}
	lines = append(lines, row(s.Total), "", rate)
	for _, t := range v.tenants {
		lines = append(lines, fmt.Sprintf("  %-7s %s", t.Name, t.About))
	}
	status := "admitted: by the gate; back: from retry when due; dlq: dead-lettered"
	if v.logLines != nil {
		if n := v.logLines(); n > 0 {
			status = fmt.Sprintf("%d warning or error lines logged (printed at the end)", n)
		}
	}
	lines = append(lines, status)
	if v.width > 1 {
		for i, l := range lines {
			if r := []rune(l); len(r) >= v.width {
				lines[i] = string(r[:v.width-1])
			}
		}
	}
	return lines
}

func itoa(n int) string { return fmt.Sprint(n) }

// balance shows what an account is off by, if anything.
func balance(d int) string {
	if d == 0 {
		return ""
	}
	return fmt.Sprintf(" %+d", d)
}

// finish ends the live view and prints the summary.
func (v *demoView) finish(s *demoSummary) {
	v.close()
	writeSummary(v.out, s)
}

// close shows the cursor again if the live view hid it. It may be called
// more than once.
func (v *demoView) close() {
	if v.live && v.drawn > 0 && !v.closed {
		io.WriteString(v.out, ansiShowCur)
		v.closed = true
	}
}

// writeSummary prints the summary table and the verdicts.
func writeSummary(w io.Writer, s *demoSummary) {
	how := "ran for"
	if s.Interrupted {
		how = "interrupted after"
	}
	fmt.Fprintf(w, "\nSummary: traffic %s %.1fs; %s\n\n", how, s.Traffic.Seconds(), s.Where)
	const f = "%-8s %-6s %8s %9s %9s %6s %14s %8s %5s  %s"
	row := func(args ...any) { fmt.Fprintln(w, strings.TrimRight(fmt.Sprintf(f, args...), " ")) }
	row("tenant", "limit", "offered", "admitted", "deferred", "back", "dead-lettered", "waiting", "lost", "max per window")
	held := true
	for _, c := range s.Tenants {
		var verdicts []string
		for _, ck := range s.Checks {
			if ck.Tenant != c.Tenant {
				continue
			}
			if ck.Held {
				verdicts = append(verdicts, fmt.Sprintf("%d/%d held", ck.Max, ck.Rule.Limit))
			} else {
				held = false
				verdicts = append(verdicts, fmt.Sprintf("%d/%d EXCEEDED", ck.Worst, ck.Rule.Limit))
			}
		}
		if len(verdicts) == 0 {
			verdicts = []string{"no limit"}
		}
		row(c.Tenant, c.Rule, itoa(c.Offered), itoa(c.Direct), itoa(c.Deferred), itoa(c.Back),
			itoa(c.Dead), itoa(c.Waiting), itoa(c.Lost), strings.Join(verdicts, ", "))
	}
	t := s.Total
	row("total", "", itoa(t.Offered), itoa(t.Direct), itoa(t.Deferred), itoa(t.Back),
		itoa(t.Dead), itoa(t.Waiting), itoa(t.Lost), "")
	fmt.Fprintln(w)
	fmt.Fprintf(w, "lost: %d   (each offered id looked up in the output topics; offered %d = admitted %d + deferred %d + dead-lettered by the gate %d%s)\n",
		t.Lost, t.Offered, t.Direct, t.Deferred, t.Rejected, balance(t.Offered-t.Direct-t.Deferred-t.Rejected))
	fmt.Fprintf(w, "still waiting in retry at the end: %d   (their slots are reserved and counted; a running gatekeeper forwards them when due)\n", t.Waiting)
	if t.Duplicates > 0 || s.Unknown > 0 {
		fmt.Fprintf(w, "duplicates downstream: %d (at-least-once); output records with an id never offered: %d\n", t.Duplicates, s.Unknown)
	}
	if held {
		fmt.Fprintln(w, "limits: every tenant held to its limit in every window")
	} else {
		fmt.Fprintln(w, "limits: EXCEEDED for at least one tenant (see above)")
	}
}
