package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
)

// TestGateCostFromUnits runs the gate with a rule counting units read from
// each event (GATEKEEPER_COST_FROM=json:cost): the events whose units fit are
// admitted in order, the next deferred, one over the rule's whole limit
// rejected with its own reason, and those without a valid cost dead-lettered
// as invalid with theirs.
func TestGateCostFromUnits(t *testing.T) {
	t.Parallel()
	f := newFlow(t, 1)
	gk := startGatekeeper(t, "gk", f.env(t,
		"GATEKEEPER_LIMITS", "*=100u/1d,1000/1d", // a day: the batches never straddle a window
		"GATEKEEPER_TENANT_FROM", "key",
		"GATEKEEPER_COST_FROM", "json:cost",
		"GATEKEEPER_ROLES", "gate"))
	gk.waitReady(90 * time.Second)

	events := []struct {
		value  string
		want   string // "down", "retry", or a substring of gk-reason
		tenant string
	}{
		{`{"cost":40}`, "down", "acme"},
		{`{"cost":-1}`, `cost "-1" is negative`, "acme"},
		{`{"cost":50}`, "down", "acme"},
		{`{"cost":2.5}`, `cost "2.5" is not a whole number`, "acme"},
		{`{"cost":101}`, "cost of 101 units over the whole limit of rule 100u/1d", "acme"},
		{`{"n":1}`, `cost: json path "cost" not found`, "acme"},
		{`{"cost":20}`, "retry", "acme"}, // 40+50+20 > 100
		{`{"cost":10}`, "retry", "acme"}, // after the one before it
		{`{"cost":100}`, "down", "other"},
	}
	var msgs []kafka.Message
	for i, e := range events {
		msgs = append(msgs, kafka.Message{Key: []byte(e.tenant), Value: []byte(e.value),
			Headers: []kafka.Header{{Key: "test-id", Value: []byte(fmt.Sprint(i))}}})
	}
	produce(t, f.Source, msgs)
	var o outputs
	waitFor(t, 60*time.Second, "every event routed", func() (bool, string) {
		o = readOutputs(t, f)
		return len(o.all()) >= len(msgs), fmt.Sprintf("%s of %d", o, len(msgs))
	})
	got := map[string]string{}
	for _, m := range o.down {
		got[header(m, "test-id")] = "down"
	}
	for _, m := range o.retry {
		got[header(m, "test-id")] = "retry"
	}
	for _, m := range o.dlq {
		got[header(m, "test-id")] = header(m, "gk-reason")
	}
	for i, e := range events {
		if g := got[fmt.Sprint(i)]; !strings.Contains(g, e.want) || g == "" {
			t.Errorf("event %d %s: got %q, want %q", i, e.value, g, e.want)
		}
	}
	if len(o.all()) != len(msgs) {
		t.Errorf("outputs: got %s, want %d events in all", o, len(msgs))
	}
}
