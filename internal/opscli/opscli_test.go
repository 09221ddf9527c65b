package opscli

import (
	"flag"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gatekeeper-dev/gatekeeper/internal/override"
	"github.com/gatekeeper-dev/gatekeeper/internal/top"
	"github.com/gatekeeper-dev/gatekeeper/internal/worker"
)

func TestParseInterleaved(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	reason := fs.String("reason", "", "")
	version := fs.Int64("version", -1, "")
	pos, err := parseInterleaved(fs, []string{"acme", "--reason", "why not", "500/1m", "--version", "3"})
	if err != nil || !slices.Equal(pos, []string{"acme", "500/1m"}) || *reason != "why not" || *version != 3 {
		t.Fatalf("got %v %v %q %d", pos, err, *reason, *version)
	}
}

func TestRenderTop(t *testing.T) {
	exp := time.Date(2026, 12, 1, 21, 0, 0, 0, time.UTC)
	resp := worker.TopResponse{Window: "1m0s", Replicas: 3, Sort: "deferred", Current: worker.TopTable{
		Start: time.Date(2026, 12, 1, 20, 0, 0, 0, time.UTC),
		Rows: []worker.TopRow{
			{Row: top.Row{Tenant: "acme\x1b[2J", Counts: top.Counts{Admitted: 10, Deferred: 5, Rejected: 1}, Waiting: 5}, Rules: []string{"10/1m"},
				Override: &override.Record{Version: 7, Rules: []string{"10/1m"}, Expires: &exp}},
			{Row: top.Row{Tenant: "newco", Counts: top.Counts{Admitted: 3, ShadowDeferred: 2}}, Rules: nil,
				Override: &override.Record{Version: 8, Rules: []string{"1/1m"}, Shadow: true}},
		},
		Other: top.Counts{Admitted: 4},
	}}
	var b strings.Builder
	renderTop(&b, resp, time.Date(2026, 12, 1, 20, 0, 30, 0, time.UTC), time.Second)
	out := b.String()
	for _, want := range []string{
		"gatekeeper top - 20:00:30 - replicas 3 - window 1m0s - sorted by deferred - every 1s, Ctrl-C quits",
		"acme?[2J", "v7 until 21:00:00", "v8 shadow 1/1m (would defer 2, reject 0)", "(others)", "none",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in:\n%s", want, out)
		}
	}
	if strings.Contains(out, "\x1b") {
		t.Errorf("an escape sequence from a tenant name reached the output:\n%q", out)
	}
}
