package main

import (
	"fmt"
	"slices"
	"strings"
)

// Rounds: on a shared machine one drain of each mode can land on a busy
// second, so the main scenario may run every mode several times, the modes
// interleaved (passthrough, seed-naive, ..., then again). A mode is reported
// by its median round; the ratios of every round are kept, so that the spread
// is visible.

// median returns the mode's round with the median events/s (the lower one of
// the two middle rounds for an even count), with the latency of the round
// that measured it, the highest peak RSS of all rounds, and every round's
// events/s.
func median(rounds []result) result {
	sorted := slices.Clone(rounds)
	slices.SortStableFunc(sorted, func(a, b result) int {
		switch {
		case a.EventsPerSec < b.EventsPerSec:
			return -1
		case a.EventsPerSec > b.EventsPerSec:
			return 1
		}
		return 0
	})
	m := sorted[(len(sorted)-1)/2]
	m.RoundEventsPerSec = nil
	for _, r := range rounds {
		m.RoundEventsPerSec = append(m.RoundEventsPerSec, r.EventsPerSec)
		m.PeakRSSMB = max(m.PeakRSSMB, r.PeakRSSMB)
		if r.LatencyN > 0 && m.LatencyN == 0 {
			m.LatencyN, m.P50ms, m.P99ms = r.LatencyN, r.P50ms, r.P99ms
		}
	}
	return m
}

// roundsTable lists every round's events/s per mode and, per round, each
// mode's ratio to that round's passthrough; empty with one round.
func (r *report) roundsTable() string {
	var pass []float64
	for _, x := range r.Main.Results {
		if x.Mode == modePassthrough {
			pass = x.RoundEventsPerSec
		}
	}
	n := 0
	for _, x := range r.Main.Results {
		n = max(n, len(x.RoundEventsPerSec))
	}
	if n < 2 {
		return ""
	}
	var b strings.Builder
	b.WriteString("| mode |")
	for i := range n {
		fmt.Fprintf(&b, " round %d |", i+1)
	}
	b.WriteString(" × passthrough, per round |\n|---|")
	b.WriteString(strings.Repeat("---:|", n+1) + "\n")
	for _, x := range r.Main.Results {
		fmt.Fprintf(&b, "| %s |", x.Mode)
		var ratios []string
		for i := range n {
			if i >= len(x.RoundEventsPerSec) {
				b.WriteString(" – |")
				continue
			}
			fmt.Fprintf(&b, " %s |", fmtRate(x.RoundEventsPerSec[i]))
			if i < len(pass) && pass[i] > 0 {
				ratios = append(ratios, fmt.Sprintf("%.2f", x.RoundEventsPerSec[i]/pass[i]))
			}
		}
		fmt.Fprintf(&b, " %s |\n", strings.Join(ratios, ", "))
	}
	return b.String()
}
