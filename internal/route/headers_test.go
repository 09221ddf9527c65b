package route

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/segmentio/kafka-go"
)

func testDeferral() Deferral {
	return Deferral{
		Attempt:         2,
		Due:             t0.Add(30 * time.Second),
		Reserved:        t0.Add(time.Minute),
		FirstSeen:       t0.Add(-time.Hour),
		Tenant:          "acme",
		OriginTopic:     "events",
		OriginPartition: 3,
		OriginOffset:    1234567890123,
	}
}

func TestWithDeferral(t *testing.T) {
	d := testDeferral()
	orig := kafka.Message{
		Key:   []byte("k"),
		Value: []byte("v"),
		Headers: hdr(
			"trace", "1",
			"gk-attempt", "1",
			"gk-custom-stale", "x",
			"user", "u",
			"gk-reason", "old",
		),
	}
	origHeaders := view([]kafka.Message{orig})[0].Headers

	got := WithDeferral(orig, d)

	want := []string{
		"trace=1", "user=u",
		"gk-attempt=2",
		"gk-due=" + ms(d.Due),
		"gk-reserved=" + ms(d.Reserved),
		"gk-tenant=acme",
		"gk-origin-topic=events",
		"gk-origin-partition=3",
		"gk-origin-offset=1234567890123",
		"gk-first-seen=" + ms(d.FirstSeen),
	}
	if diff := cmp.Diff(want, view([]kafka.Message{got})[0].Headers); diff != "" {
		t.Errorf("headers mismatch (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(origHeaders, view([]kafka.Message{orig})[0].Headers); diff != "" {
		t.Errorf("original message changed (-want +got):\n%s", diff)
	}
	if string(got.Key) != "k" || string(got.Value) != "v" {
		t.Errorf("got key %q value %q, want k and v", got.Key, got.Value)
	}

	back, err := ParseDeferral(got)
	if err != nil {
		t.Fatalf("ParseDeferral: %v", err)
	}
	if diff := cmp.Diff(d, back); diff != "" {
		t.Errorf("round trip mismatch (-want +got):\n%s", diff)
	}

	// Deferring again replaces, never duplicates.
	d2 := d
	d2.Attempt = 3
	again := WithDeferral(got, d2)
	if n := len(again.Headers); n != len(got.Headers) {
		t.Errorf("got %d headers after re-deferral, want %d", n, len(got.Headers))
	}
	back2, err := ParseDeferral(again)
	if err != nil {
		t.Fatalf("ParseDeferral: %v", err)
	}
	if back2.Attempt != 3 {
		t.Errorf("got attempt %d, want 3", back2.Attempt)
	}
}

// TestWithDeferralWindows: gk-windows (Deferral.Windows) is written after
// the other deferral headers when set, read back, replaced by a re-deferral
// under other windows and dropped by one that names none; absent or too
// long, it names no windows.
func TestWithDeferralWindows(t *testing.T) {
	d := testDeferral()
	d.Windows = "2w9pb1zq3x0k"
	got := WithDeferral(kafka.Message{Value: []byte("v")}, d)
	hs := view([]kafka.Message{got})[0].Headers
	if last := hs[len(hs)-1]; last != "gk-windows=2w9pb1zq3x0k" {
		t.Errorf("last header %q, want gk-windows=2w9pb1zq3x0k", last)
	}
	back, err := ParseDeferral(got)
	if err != nil || back.Windows != d.Windows {
		t.Errorf("read back windows %q (%v), want %q", back.Windows, err, d.Windows)
	}
	d.Windows = "other"
	if back, _ := ParseDeferral(WithDeferral(got, d)); back.Windows != "other" {
		t.Errorf("re-deferred under other windows: read %q, want other", back.Windows)
	}
	d.Windows = ""
	again := WithDeferral(got, d)
	if back, _ := ParseDeferral(again); back.Windows != "" || len(again.Headers) != len(got.Headers)-1 {
		t.Errorf("re-deferred naming none: read %q with %d headers, want none with %d", back.Windows, len(again.Headers), len(got.Headers)-1)
	}
	long := got
	long.Headers = append(append([]kafka.Header(nil), got.Headers...), kafka.Header{Key: HeaderWindows, Value: []byte(strings.Repeat("x", maxWindowsHeader+1))})
	if back, err := ParseDeferral(long); err != nil || back.Windows != "" {
		t.Errorf("a gk-windows of %d bytes: read %q (%v), want none", maxWindowsHeader+1, back.Windows, err)
	}
}

func TestWithDeferralNoAliasing(t *testing.T) {
	hs := make([]kafka.Header, 1, 10) // spare capacity that an append could write into
	hs[0] = kafka.Header{Key: "a", Value: []byte("1")}
	orig := kafka.Message{Headers: hs}
	_ = WithDeferral(orig, testDeferral())
	_ = WithReason(orig, "r")
	if got := hs[:2][1].Key; got != "" {
		t.Errorf("got %q written past the original headers, want nothing", got)
	}
}

func TestWithDeferralRounding(t *testing.T) {
	d := testDeferral()
	d.Due = t0.Add(1500 * time.Microsecond)      // 1.5ms after t0
	d.Reserved = t0.Add(2500 * time.Microsecond) // 2.5ms after t0
	got, err := ParseDeferral(WithDeferral(kafka.Message{}, d))
	if err != nil {
		t.Fatal(err)
	}
	if want := t0.Add(2 * time.Millisecond); !got.Due.Equal(want) {
		t.Errorf("got due %v, want %v (rounded up)", got.Due, want)
	}
	if want := t0.Add(2 * time.Millisecond); !got.Reserved.Equal(want) {
		t.Errorf("got reserved %v, want %v (rounded down)", got.Reserved, want)
	}
}

func TestWithReason(t *testing.T) {
	m := kafka.Message{Headers: hdr("a", "1", "gk-reason", "old", "gk-tenant", "t", "b", "2")}
	got := view([]kafka.Message{WithReason(m, "max attempts")})[0].Headers
	want := []string{"a=1", "gk-tenant=t", "b=2", "gk-reason=max attempts"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("headers mismatch (-want +got):\n%s", diff)
	}
}

func TestWithOrigin(t *testing.T) {
	m := kafka.Message{Topic: "events", Partition: 2, Offset: 42, Headers: hdr("a", "1", "gk-due", "5")}
	tests := []struct {
		tenant string
		want   []string
	}{
		{tenant: "acme", want: []string{"a=1", "gk-tenant=acme", "gk-origin-topic=events", "gk-origin-partition=2", "gk-origin-offset=42"}},
		{tenant: "", want: []string{"a=1", "gk-origin-topic=events", "gk-origin-partition=2", "gk-origin-offset=42"}},
	}
	for _, tt := range tests {
		got := view([]kafka.Message{withOrigin(m, tt.tenant)})[0].Headers
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("tenant %q: headers mismatch (-want +got):\n%s", tt.tenant, diff)
		}
	}
}

func TestParseDeferralErrors(t *testing.T) {
	valid := WithDeferral(kafka.Message{}, testDeferral()).Headers
	set := func(name, value string) []kafka.Header {
		hs := withHeaders(kafka.Message{Headers: valid}, func(k string) bool { return k == name }).Headers
		if value != "<none>" {
			hs = append(hs, kafka.Header{Key: name, Value: []byte(value)})
		}
		return hs
	}
	tests := []struct {
		name    string
		headers []kafka.Header
		wantErr string
	}{
		{name: "no headers", headers: nil, wantErr: "no header gk-attempt"},
		{name: "no due", headers: set(HeaderDue, "<none>"), wantErr: "no header gk-due"},
		{name: "bad due", headers: set(HeaderDue, "soon"), wantErr: `header gk-due: "soon" is not an integer`},
		{name: "empty reserved", headers: set(HeaderReserved, ""), wantErr: "header gk-reserved is empty"},
		{name: "no first seen", headers: set(HeaderFirstSeen, "<none>"), wantErr: "no header gk-first-seen"},
		{name: "attempt zero", headers: set(HeaderAttempt, "0"), wantErr: "header gk-attempt: 0 is below 1"},
		{name: "attempt overflow", headers: set(HeaderAttempt, "99999999999"), wantErr: `header gk-attempt: "99999999999" is not an integer`},
		{name: "no tenant", headers: set(HeaderTenant, "<none>"), wantErr: "no header gk-tenant"},
		{name: "tenant too long", headers: set(HeaderTenant, strings.Repeat("t", 257)), wantErr: "header gk-tenant: tenant over 256 bytes"},
		{name: "no origin topic", headers: set(HeaderOriginTopic, "<none>"), wantErr: "no header gk-origin-topic"},
		{name: "bad partition", headers: set(HeaderOriginPartition, "x"), wantErr: `header gk-origin-partition: "x" is not an integer`},
		{name: "bad offset", headers: set(HeaderOriginOffset, "1.5"), wantErr: `header gk-origin-offset: "1.5" is not an integer`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseDeferral(kafka.Message{Headers: tt.headers})
			if err == nil {
				t.Fatalf("got %+v, want error %q", got, tt.wantErr)
			}
			if err.Error() != tt.wantErr {
				t.Errorf("got error %q, want %q", err, tt.wantErr)
			}
		})
	}
}

func TestParseDeferralLastHeaderWins(t *testing.T) {
	m := WithDeferral(kafka.Message{}, testDeferral())
	m.Headers = append(m.Headers, kafka.Header{Key: HeaderAttempt, Value: []byte("4")})
	d, err := ParseDeferral(m)
	if err != nil {
		t.Fatal(err)
	}
	if d.Attempt != 4 {
		t.Errorf("got attempt %d, want 4", d.Attempt)
	}
}

// origins gives the events of one batch the headers withOrigin gives each
// alone, in at most a few allocations per batch (withOrigin alone took three
// per event), and no event's headers or values alias another's.
func TestOriginsBatch(t *testing.T) {
	var msgs []kafka.Message
	for i := range 500 {
		m := kafka.Message{Topic: "events", Partition: 3, Offset: int64(1000 + i), Key: []byte(fmt.Sprintf("tenant-%d", i%7))}
		if i%3 == 0 {
			m.Headers = hdr("a", "1", "gk-tenant", "forged")
		}
		msgs = append(msgs, m)
	}
	msgs[499].Partition = 4 // a second partition in one batch still gets its own values
	o := newOrigins(msgs)
	got := make([]kafka.Message, len(msgs))
	for i, m := range msgs {
		tenant := string(m.Key)
		if i%5 == 0 {
			tenant = ""
		}
		got[i] = o.with(m, tenant)
		want := withOrigin(m, tenant)
		if diff := cmp.Diff(view([]kafka.Message{want})[0].Headers, view([]kafka.Message{got[i]})[0].Headers); diff != "" {
			t.Fatalf("event %d: headers mismatch (-withOrigin +origins):\n%s", i, diff)
		}
	}
	before := view(got[1:2])[0].Headers
	got[0].Headers = append(got[0].Headers, kafka.Header{Key: "x", Value: []byte("y")})
	got[0].Headers[len(got[0].Headers)-2].Value = append(got[0].Headers[len(got[0].Headers)-2].Value, '9')
	if diff := cmp.Diff(before, view(got[1:2])[0].Headers); diff != "" {
		t.Errorf("appending to one event's headers changed the next one's (-before +after):\n%s", diff)
	}
	tenants := make([]string, len(msgs))
	for i, m := range msgs {
		tenants[i] = string(m.Key)
	}
	allocs := testing.AllocsPerRun(20, func() {
		o := newOrigins(msgs)
		for i, m := range msgs {
			_ = o.with(m, tenants[i])
		}
		o.release()
	})
	if allocs > 4 {
		t.Errorf("origins of a 500-event batch: got %.0f allocations, want at most 4 (one buffer, one header slice, none once recycled)", allocs)
	}
	// Released buffers keep no source header alive.
	o = newOrigins(msgs)
	_ = o.with(msgs[0], "t")
	hs := o.hdrs[:cap(o.hdrs)]
	o.release()
	for i, h := range hs {
		if h.Key != "" || h.Value != nil {
			t.Fatalf("released header %d still holds %q=%q", i, h.Key, h.Value)
		}
	}
}
