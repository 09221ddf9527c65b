package route

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/segmentio/kafka-go"

	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
)

func TestParseCostFrom(t *testing.T) {
	for spec, quote := range map[string]string{
		"header:cost":  "",
		"json:meta.n":  "",
		"key":          `cost source "key": want header:<name> or json:<dot.path>`,
		"header:":      `cost source "header:": header name is empty`,
		"json:a..b":    `cost source "json:a..b": json path has an empty segment`,
		"header:gk-n":  `cost source "header:gk-n": headers starting with "gk-" are Gatekeeper's`,
		"json:\xff":    `not valid UTF-8`,
		"value:weight": `want header:<name> or json:<dot.path>`,
	} {
		c, err := ParseCostFrom(spec)
		switch {
		case quote == "" && err != nil:
			t.Errorf("ParseCostFrom(%q): got %v, want no error", spec, err)
		case quote == "" && c.String() != spec:
			t.Errorf("ParseCostFrom(%q).String(): got %q, want %q", spec, c.String(), spec)
		case quote != "" && (err == nil || !strings.Contains(err.Error(), quote)):
			t.Errorf("ParseCostFrom(%q): got %v, want an error containing %s", spec, err, quote)
		}
	}
	if c, err := ParseCostFrom(""); c != nil || err != nil {
		t.Errorf(`ParseCostFrom(""): got %v, %v, want nil, nil`, c, err)
	}
}

func TestEventBytes(t *testing.T) {
	m := kafka.Message{Key: []byte("key"), Value: []byte("value!"),
		Headers: hdr("trace", "abc", "gk-tenant", "forged", "x", "")}
	// 3 + 6 + (5 + 3) + (1 + 0); the gk- header is Gatekeeper's, not counted.
	if got, want := EventBytes(m), int64(18); got != want {
		t.Errorf("EventBytes: got %d, want %d", got, want)
	}
	d := WithDeferral(m, deferral("t", 1, t0, t0.Add(time.Minute)))
	if got, want := EventBytes(d), int64(18); got != want {
		t.Errorf("EventBytes after WithDeferral: got %d, want %d (gk- headers are not counted)", got, want)
	}
	if got := EventBytes(kafka.Message{}); got != 0 {
		t.Errorf("EventBytes of an empty event: got %d, want 0", got)
	}
}

func TestCostFromCost(t *testing.T) {
	header, err := ParseCostFrom("header:cost")
	if err != nil {
		t.Fatal(err)
	}
	jsonc, err := ParseCostFrom("json:meta.cost")
	if err != nil {
		t.Fatal(err)
	}
	hm := func(vs ...string) kafka.Message {
		var hs []kafka.Header
		for _, v := range vs {
			hs = append(hs, kafka.Header{Key: "cost", Value: []byte(v)})
		}
		return kafka.Message{Key: []byte("k"), Value: []byte("v"), Headers: hs}
	}
	jm := func(v string) kafka.Message { return kafka.Message{Value: []byte(v)} }
	tests := []struct {
		name  string
		c     *CostFrom
		m     kafka.Message
		units int64
		err   string
	}{
		{"header", header, hm("12"), 12, ""},
		{"header zero", header, hm("0"), 0, ""},
		{"header max", header, hm("1099511627776"), limit.MaxCost, ""},
		{"header twice, same", header, hm("7", "7"), 7, ""},
		{"header twice, differing", header, hm("7", "8"), 0, `cost: header "cost" appears twice with different values`},
		{"header missing", header, hm(), 0, `cost: no header "cost"`},
		{"header empty", header, hm(""), 0, `cost "" is not a number`},
		{"header negative", header, hm("-3"), 0, `cost "-3" is negative`},
		{"header fractional", header, hm("2.5"), 0, `cost "2.5" is not a whole number`},
		{"header exponent", header, hm("1e3"), 0, `cost "1e3" is not a whole number in plain decimal`},
		{"header too big", header, hm("1099511627777"), 0, `cost "1099511627777" is over 2^40`},
		{"header far too big", header, hm("99999999999999999999999"), 0, `is over 2^40`},
		{"header words", header, hm("ten"), 0, `cost "ten" is not a number`},
		{"header plus", header, hm("+4"), 0, `cost "+4" is not a whole number in plain decimal`},
		{"json", jsonc, jm(`{"meta":{"cost":250},"x":1}`), 250, ""},
		{"json missing", jsonc, jm(`{"meta":{}}`), 0, `cost: json path "meta.cost" not found`},
		{"json string", jsonc, jm(`{"meta":{"cost":"5"}}`), 0, `cost: json path "meta.cost" is not a number`},
		{"json null", jsonc, jm(`{"meta":{"cost":null}}`), 0, `is not a number`},
		{"json negative", jsonc, jm(`{"meta":{"cost":-1}}`), 0, `cost "-1" is negative`},
		{"json fractional", jsonc, jm(`{"meta":{"cost":0.5}}`), 0, `cost "0.5" is not a whole number`},
		{"json too big", jsonc, jm(`{"meta":{"cost":2e12}}`), 0, `not a whole number in plain decimal`},
		{"json bad", jsonc, jm(`{"meta":`), 0, `cost: bad json`},
		{"json twice", jsonc, jm(`{"meta":{"cost":1,"cost":2}}`), 0, `key "cost" appears twice`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.c.Cost(tt.m)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("Cost: got %+v, %v, want an error containing %s", got, err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Cost: %v", err)
			}
			want := limit.Cost{Bytes: EventBytes(tt.m), Units: tt.units}
			if got != want {
				t.Errorf("Cost: got %+v, want %+v", got, want)
			}
		})
	}
	var none *CostFrom
	if got, err := none.Cost(hm("3")); err != nil || got != (limit.Cost{Bytes: 7}) {
		t.Errorf("nil CostFrom: got %+v, %v, want bytes 7 (k, v, cost, 3) and no units", got, err)
	}
}

// TestGateCosts checks that the Gate passes each valid event's cost to the
// Admitter and dead-letters an event whose cost cannot be read, with the
// reason, as it does one without a tenant.
func TestGateCosts(t *testing.T) {
	f := newGate(t, byTenant(gateDecisions))
	var err error
	if f.gate.CostFrom, err = ParseCostFrom("header:cost"); err != nil {
		t.Fatal(err)
	}
	withCost := func(m kafka.Message, v string) kafka.Message {
		m.Headers = append(m.Headers, kafka.Header{Key: "cost", Value: []byte(v)})
		return m
	}
	batch := []kafka.Message{withCost(srcMsg(10, "ok"), "5"), withCost(srcMsg(11, "ok"), "-1"),
		srcMsg(12, "ok"), withCost(srcMsg(13, "ok"), "0")}
	if err := f.gate.Handle(context.Background(), batchOf(batch)); err != nil {
		t.Fatalf("Handle: %v", err)
	}
	wantCosts := [][]limit.Cost{{{Bytes: EventBytes(batch[0]), Units: 5}, {Bytes: EventBytes(batch[3]), Units: 0}}}
	if diff := cmp.Diff(wantCosts, f.admitter.Costs()); diff != "" {
		t.Errorf("Admit costs (-want +got):\n%s", diff)
	}
	cost := func(off int64, v string) []string {
		return []string{"trace=t" + strconv.FormatInt(off, 10), "cost=" + v}
	}
	want := []out{
		{Topic: "down", Key: "ok", Value: "v10", Headers: append(cost(10, "5"), admitted("ok", 10)...), Time: t0.Add(-time.Second)},
		{Topic: "down.dlq", Key: "ok", Value: "v11", Headers: append(append(cost(11, "-1"), origin(11)...), `gk-reason=cost "-1" is negative`), Time: t0.Add(-time.Second)},
		srcOut("down.dlq", 12, "ok", append(origin(12), `gk-reason=cost: no header "cost"`)...),
		{Topic: "down", Key: "ok", Value: "v13", Headers: append(cost(13, "0"), admitted("ok", 13)...), Time: t0.Add(-time.Second)},
	}
	diffOut(t, want, f.writer.last(t))
}

// TestRetrierCosts checks that an event admitted again is admitted at the
// cost read from it as from its source (its gk- headers not counted), and
// one whose cost cannot be read is dead-lettered.
func TestRetrierCosts(t *testing.T) {
	f := newRetrier(t, byTenant(map[string]limit.Decision{"a": {Kind: limit.Admit}}))
	var err error
	if f.retrier.CostFrom, err = ParseCostFrom("header:cost"); err != nil {
		t.Fatal(err)
	}
	late := deferral("a", 1, t0.Add(-time.Minute), t0.Add(-time.Second))
	good := retryMsg("down.retry", 1, late)
	good.Headers = append(good.Headers, kafka.Header{Key: "cost", Value: []byte("9")})
	bad := retryMsg("down.retry", 2, late)
	if err := f.retrier.Handle(context.Background(), batchOf([]kafka.Message{good, bad})); err != nil {
		t.Fatalf("Handle: %v", err)
	}
	// k1 + v + trace=x + cost=9: 2 + 1 + 6 + 5.
	if diff := cmp.Diff([][]limit.Cost{{{Bytes: 14, Units: 9}}}, f.admitter.Costs()); diff != "" {
		t.Errorf("Admit costs (-want +got):\n%s", diff)
	}
	diffOut(t, []out{outOf(good, "down"), outOf(bad, "down.dlq", `gk-reason=cost: no header "cost"`)}, f.writer.last(t))
}
