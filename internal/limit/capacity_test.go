package limit

import (
	"context"
	"fmt"
	"maps"
	"math"
	"math/rand"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/gatekeeper-dev/gatekeeper/internal/testenv"
)

// capWindow reads a capacity window's hash: the count, the active weight and
// what each tenant booked there (by tenant name).
func capWindow(t testing.TB, l *Limiter, r Rule, start time.Time) (count, active int64, booked map[string]int64) {
	t.Helper()
	h, err := l.rdb.HGetAll(context.Background(), l.keys.capacity(r)+WindowSep+strconv.FormatInt(start.UnixMilli(), 10)).Result()
	if err != nil {
		t.Fatal(err)
	}
	booked = map[string]int64{}
	var sum int64
	for k, v := range h {
		n, _ := strconv.ParseInt(v, 10, 64)
		switch {
		case k == "count":
			count = n
		case k == "a":
			active = n
		case strings.HasPrefix(k, "t:"):
			booked[k[2:]] = n
			sum += n
		}
	}
	if sum != count {
		t.Errorf("window %v: tenants booked %d, count %d", start, sum, count)
	}
	return count, active, booked
}

func TestParseCapacityAndShares(t *testing.T) {
	for _, tc := range []struct{ capacity, limits, err string }{
		{"5000/1s", "*=100/1m;a=weight:3,floor:200/1s", ""},
		{"5000/1s,200000/1m", "a=1000/1m,weight:2,floor:100/1s,floor:1000/1m;*=weight:1", ""},
		{"5000/1h", "*=100/1m", ""},
		{"5000/1h,100000/24h", "*=100/1m;a=floor:100/1h", ""},
		{"5000/5h", "*=100/1m", "does not tile"},
		{"5000/1d", "*=100/1m;a=floor:100/1d", ""},
		{"5000/1h,50000/1w", "*=100/1m;a=floor:1000/1w", ""},
		{"5000/2d", "*=100/1m", "does not tile"},
		{"5000/1mo", "*=100/1m", "not months"},
		{"5MiB/1s", "*=100/1m", ""},
		{"5MiB/1s,200MiB/1m", "a=1000/1m,floor:1MiB/1s,floor:20MiB/1m", ""},
		{"2000u/1s", "a=floor:500u/1s", ""},
		{"5MiB/1s,1000/1m", "*=100/1m", "count one measure"},
		{"5MiB/1s", "a=floor:200/1s", "floor 200/1s counts events, the capacity 5MiB/1s counts bytes"},
		{"5000/1s", "a=floor:1MiB/1s", "floor 1MiB/1s counts bytes, the capacity 5000/1s counts events"},
		{"2000u/1s", "a=floor:1KiB/1s", "counts bytes, the capacity 2000u/1s counts units"},
		{"5MiB/1s", "a=floor:3MiB/1s;b=floor:3MiB/1s", "sum to 6291456"},
		{"5MiB/1s", "a=floor:1MiB/1s,floor:10/1s", "two floors for window 1s"},
		{"5000/7s", "*=100/1m", "does not tile"},
		{"100/1s", "a=floor:60/1s;b=floor:50/1s", "sum to 110"},
		{"100/1s", "a=floor:10/1m", "no capacity rule of window 1m"},
		{"100/1s", "*=floor:10/1s", "named tenant"},
		{"100/1s", "a=weight:0", "from 1 to 1000"},
		{"100/1s", "a=weight:2,weight:3", "weight given twice"},
		{"100/1s", "a=speed:3", "unknown setting"},
	} {
		t.Run(tc.capacity+" "+tc.limits, func(t *testing.T) {
			c, err := ParseCapacity(tc.capacity)
			if err == nil {
				var rs *Rules
				if rs, err = ParseRules(tc.limits); err == nil {
					err = CheckCapacity(rs, c)
				}
			}
			switch {
			case tc.err == "" && err != nil:
				t.Fatalf("got %v, want no error", err)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Fatalf("got %v, want an error with %q", err, tc.err)
			}
		})
	}
	rs := mustRules(t, "*=100/1m,weight:2;a=weight:3,floor:200/1s;b=10/1s")
	if got := rs.For("a"); len(got) != 1 || got[0].String() != "100/1m" {
		t.Errorf("a share alone: rules %v, want the default's", got)
	}
	if s := rs.Share("a"); s.Weight != 3 || s.floor(Rule{Limit: 1, Count: 1, Unit: Second}) != 200 {
		t.Errorf("a: %+v", s)
	}
	if s := rs.Share("b"); s.Weight != 2 {
		t.Errorf("b: weight %d, want 2 (from *)", s.Weight)
	}
}

// TestCapacityWorkedExample runs the README's worked example for several
// seconds of steady flooding: capacity 100/1s; a sends 10 a second, b 200,
// c (weight 2, floor 30/1s) 100, each spread over the second. From the
// second second on (the first with a history: each window's level is the
// water level of the demand predicted for it) every second is the
// water-filling answer within 5%: a 10, b 30, c 60.
func TestCapacityWorkedExample(t *testing.T) {
	workedExample(t, "100/1s", "*=100000/1m;c=100000/1m,weight:2,floor:30/1s", time.Second)
}

// TestCapacityWorkedExampleHours is the worked example with hour windows
// (CAPACITY=100/1h, floor:30/1h; the horizon, 24h, is 24 windows): the model keeps its
// times as fractions of the window, so every hour books the same answer.
func TestCapacityWorkedExampleHours(t *testing.T) {
	workedExample(t, "100/1h", "*=100000/1d;c=100000/1d,weight:2,floor:30/1h", time.Hour)
}

// workedExample runs the worked example under capacity (100 a window)
// with windows of length window: every window a sends 10, b 200 and c
// (weight 2, floor 30 a window) 100, spread over it.
func workedExample(t *testing.T, capacity, limits string, window time.Duration) {
	clk := newFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	c, err := ParseCapacity(capacity)
	if err != nil {
		t.Fatal(err)
	}
	l := newTestLimiter(t, testRedis(t), limits, Options{Clock: clk.Now, Capacity: c})
	ctx := context.Background()
	start := clk.Now()
	const steps = 20
	for sec := 0; sec < 14; sec++ {
		for k := 0; k < steps; k++ {
			clk.Set(start.Add(time.Duration(sec)*window + time.Duration(k)*window/steps))
			var batch []string
			batch = append(batch, repeat("a", 10/steps+btoi(k%2 == 0))...)
			batch = append(batch, repeat("b", 200/steps)...)
			batch = append(batch, repeat("c", 100/steps)...)
			if _, err := l.Admit(ctx, batch); err != nil {
				t.Fatal(err)
			}
		}
	}
	checkBooked(t, l, c[0], start, 1, 14, map[string]int64{"a": 10, "b": 30, "c": 60})
}

// checkBooked checks that the capacity windows of seconds from to to
// (after start) are full (work-conserving) and give each tenant of want
// what it says, within 5% or 1 event.
func checkBooked(t *testing.T, l *Limiter, r Rule, start time.Time, from, to int, want map[string]int64) {
	t.Helper()
	for sec := from; sec < to; sec++ {
		count, _, got := capWindow(t, l, r, start.Add(time.Duration(sec)*r.Length()))
		t.Logf("window %d: count %d, booked %v", sec, count, got)
		if count != r.Limit {
			t.Errorf("second %d: count %d, want %d (work-conserving)", sec, count, r.Limit)
		}
		for ten, w := range want {
			if d := got[ten] - w; d < -max(1, w/20) || d > max(1, w/20) {
				t.Errorf("second %d: %s booked %d, want %d ± 5%%", sec, ten, got[ten], w)
			}
		}
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestCapacityExactAcrossLimiters has four limiters (replicas) decide
// batches of 50 tenants at once under a capacity: no window's count
// passes the capacity, and every window's count is what its tenants booked.
// The bytes variant (capacity_cost_test.go) runs the same with events of
// 1 to 2,000 bytes.
func TestCapacityExactAcrossLimiters(t *testing.T) {
	exactAcrossLimiters(t, "300/1s,5000/1m", "*=1000/1m;t0=weight:5;t1=floor:40/1s", func(*rand.Rand) Cost { return Cost{} })
}

// exactAcrossLimiters runs four limiters (replicas) under capacity (a rule
// per second, then one per minute) for three seconds, on batches of 200
// events of 50 tenants whose costs come from cost, and checks every window
// of both rules within the capacity (capWindow: the count is what the
// tenants booked).
func exactAcrossLimiters(t *testing.T, capacity, limits string, cost func(*rand.Rand) Cost) {
	exactAcross(t, testRedis(t), testPrefix(t), capacity, limits, cost)
}

// exactAcross is exactAcrossLimiters on rdb under the key prefix prefix.
func exactAcross(t *testing.T, rdb redis.UniversalClient, prefix, capacity, limits string, cost func(*rand.Rand) Cost) {
	c, err := ParseCapacity(capacity)
	if err != nil {
		t.Fatal(err)
	}
	var ls []*Limiter
	for i := 0; i < 4; i++ {
		ls = append(ls, newTestLimiter(t, rdb, limits, Options{Prefix: prefix, Capacity: c, Horizon: 30 * time.Second}))
	}
	ctx := context.Background()
	var wg sync.WaitGroup
	var mu sync.Mutex
	admitted, booked := 0, int64(0)
	deadline := time.Now().Add(3 * time.Second)
	for i, l := range ls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewSource(int64(i)))
			for j := 0; time.Now().Before(deadline); j++ {
				batch := make([]string, 0, 200)
				costs := make([]Cost, 0, 200)
				for k := 0; k < 200; k++ {
					batch = append(batch, fmt.Sprintf("t%d", (i*7+j*13+k*k)%50))
					costs = append(costs, cost(rng))
				}
				ds, err := l.AdmitCosts(ctx, batch, costs)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				for k, d := range ds {
					if d.Kind == Admit {
						admitted++
						booked += costs[k].of(c.Measure())
					}
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	now := time.Now()
	checked := 0
	for s := now.Add(-5 * time.Second).Truncate(time.Second); s.Before(now.Add(31 * time.Second)); s = s.Add(time.Second) {
		count, _, _ := capWindow(t, ls[0], c[0], s)
		if count > c[0].Limit {
			t.Errorf("window %v: count %d over the capacity %s", s, count, c[0])
		}
		checkFloorUse(t, ls[0], c[0], s)
		if count > 0 {
			checked++
		}
	}
	for s := now.Add(-2 * time.Minute).Truncate(time.Minute); s.Before(now.Add(time.Minute)); s = s.Add(time.Minute) {
		if count, _, _ := capWindow(t, ls[0], c[1], s); count > c[1].Limit {
			t.Errorf("minute %v: count %d over the capacity %s", s, count, c[1])
		}
	}
	t.Logf("%d events admitted (%d %s), %d one-second windows with bookings", admitted, booked, c.Measure(), checked)
	if checked < 10 {
		t.Errorf("only %d windows booked: the test did not load the capacity", checked)
	}
}

// TestCapacityLateTenant: b floods alone for three seconds and reserves far
// ahead; d starts flooding in the fourth second. From the next second on d
// gets its share (half), though b had reserved into those seconds first.
func TestCapacityLateTenant(t *testing.T) {
	clk := newFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	c, _ := ParseCapacity("100/1s")
	l := newTestLimiter(t, testRedis(t), "*=100000/1m", Options{Clock: clk.Now, Capacity: c, Horizon: time.Minute})
	start := lateTenant(t, l, clk, c[0])
	// Before d came, b had reserved half of the seconds ahead (these among them).
	if _, _, got := capWindow(t, l, c[0], start.Add(10*time.Second)); got["b"] != 50 {
		t.Errorf("second 10: b reserved %d, want half the capacity (50)", got["b"])
	}
}

// lateTenant runs TestCapacityLateTenant's flood under l (a capacity of
// 100 a second in force, rule r) and checks its first eight seconds: full,
// and d's share from its second second on. It returns the first second's
// start.
func lateTenant(t *testing.T, l *Limiter, clk *fakeClock, r Rule) time.Time {
	t.Helper()
	ctx := context.Background()
	start := clk.Now()
	const steps = 20
	for sec := 0; sec < 8; sec++ {
		for k := 0; k < steps; k++ {
			clk.Set(start.Add(time.Duration(sec)*time.Second + time.Duration(k)*time.Second/steps))
			batch := repeat("b", 300/steps)
			if sec >= 3 {
				batch = append(batch, repeat("d", 300/steps)...)
			}
			if _, err := l.Admit(ctx, batch); err != nil {
				t.Fatal(err)
			}
		}
	}
	for sec := 0; sec < 8; sec++ {
		count, _, got := capWindow(t, l, r, start.Add(time.Duration(sec)*time.Second))
		t.Logf("second %d: count %d, booked %v", sec, count, got)
		if count != 100 {
			t.Errorf("second %d: count %d, want 100", sec, count)
		}
		if sec >= 4 && (got["d"] < 47 || got["d"] > 53) {
			t.Errorf("second %d: the late tenant booked %d, want its share 50 ± 3", sec, got["d"])
		}
	}
	return start
}

// TestCapacityBrokenTenant: a tenant whose own key is broken fails alone,
// and what the call wrote for it in the capacity's window is taken back.
func TestCapacityBrokenTenant(t *testing.T) {
	clk := newFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	c, _ := ParseCapacity("100/1s")
	rdb := testRedis(t)
	l := newTestLimiter(t, rdb, "*=100000/1m", Options{Clock: clk.Now, Capacity: c})
	ctx := context.Background()
	r := mustRules(t, "*=100000/1m").For("x")[0]
	s, _ := WindowBounds(r, clk.Now(), time.UTC)
	if err := rdb.Set(ctx, l.keys.window("x", r, s), "junk", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	ds, err := l.Admit(ctx, []string{"y", "x", "y", "x", "z"})
	if err != nil {
		t.Fatal(err)
	}
	if got := kinds(ds); got != "afafa" {
		t.Errorf("decisions %s, want afafa", got)
	}
	count, active, booked := capWindow(t, l, c[0], clk.Now().Truncate(time.Second))
	if count != 3 || active != 2 || booked["x"] != 0 {
		t.Errorf("capacity window: count %d, active weight %d, booked %v; want 3, 2 (y, z), none for x", count, active, booked)
	}
	h, _ := rdb.HGetAll(ctx, l.keys.capacity(c[0])+WindowSep+strconv.FormatInt(s.Truncate(time.Second).UnixMilli(), 10)).Result()
	if _, ok := h["r:x"]; ok {
		t.Errorf("the failed tenant is still marked active: %v", h)
	}
}

// TestCapacityUsageAndMetrics: the usage API's share of a flooding tenant
// (booked, level, entitlement, events waiting in later windows) and the
// collector's capacity used per window, without tenant labels.
func TestCapacityUsageAndMetrics(t *testing.T) {
	clk := newFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	c, _ := ParseCapacity("100/1s")
	reg := prometheus.NewRegistry()
	l := newTestLimiter(t, testRedis(t), "*=100000/1m;b=weight:2", Options{Clock: clk.Now, Capacity: c, Horizon: time.Minute, Registerer: reg})
	ctx := context.Background()
	start := clk.Now()
	for sec := 0; sec < 3; sec++ {
		for k := 0; k < 10; k++ {
			clk.Set(start.Add(time.Duration(sec)*time.Second + time.Duration(k)*100*time.Millisecond))
			if _, err := l.Admit(ctx, append(repeat("b", 30), repeat("a", 3)...)); err != nil {
				t.Fatal(err)
			}
		}
	}
	clk.Set(start.Add(2500 * time.Millisecond))
	us, err := l.CapacityUsage(ctx, "b")
	if err != nil || len(us) != 1 {
		t.Fatalf("CapacityUsage: %v %v", us, err)
	}
	u := us[0]
	t.Logf("%+v", u)
	// Both were capped the second before: the level is at least the equal
	// share 100 / (2 + 1), and b's entitlement is twice it.
	if u.Capacity != "100/1s" || u.Used != 100 || u.Weight != 2 || u.Level < 100.0/3-0.001 || u.Entitlement != int64(2*u.Level+1e-9) ||
		u.Booked == 0 || u.Booked > u.Used || u.Share != float64(u.Booked)/100 || u.Waiting == 0 || u.Refused == 0 || u.ActiveWeight != 3 {
		t.Errorf("b's share: %+v; want used 100, level at least 33.3, entitlement twice it (weight 2), booked part of the window, events refused and waiting, active weight 3", u)
	}
	if v := gathered(t, reg, "gatekeeper_capacity_used", "last"); v != 100 {
		t.Errorf("used in the last window: %v, want 100", v)
	}
	if v := gathered(t, reg, "gatekeeper_capacity_limit", ""); v != 100 {
		t.Errorf("capacity limit: %v, want 100", v)
	}
}

// gathered returns the value of a gathered gauge whose window label is
// window (any series when window is empty); no series fails the test.
func gathered(t *testing.T, reg *prometheus.Registry, name, window string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if window == "" {
				return m.GetGauge().GetValue()
			}
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "window" && lp.GetValue() == window {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	t.Fatalf("no %s{window=%q}", name, window)
	return 0
}

// TestCapacityLevelFromDemand: ten light tenants ask 2, 4, ..., 20 events
// a second (110) and three flood (300 a second each) under a capacity of
// 200/1s; the water level is 30. The level of each window is the exact
// water level of what the tenants asked of the window before (its demand
// histogram), so from the third second on every tenant books its
// water-filling allocation of what it asked there (booked and refused),
// within 5% or one event, and the window is full; the three floods book
// the same. (A level stepped from the window before, damped, was still
// settling then.)
func TestCapacityLevelFromDemand(t *testing.T) {
	levelFromDemand(t, "200/1s", func(string) int64 { return 1 }, 0)
}

// levelFromDemand runs TestCapacityLevelFromDemand's tenants under
// capacity, each event of a tenant costing size(tenant) in the capacity's
// measure: from the third second on, every tenant books its water-filling
// allocation of what it asked within 5% (or one of its events), give or
// take slack more of its events, and every second is full to within one
// event.
func levelFromDemand(t *testing.T, capacity string, size func(string) int64, slack int64) {
	clk := newFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	c, err := ParseCapacity(capacity)
	if err != nil {
		t.Fatal(err)
	}
	C := c[0].Limit
	l := newTestLimiter(t, testRedis(t), "*=1000000/1m", Options{Clock: clk.Now, Capacity: c, Horizon: time.Hour})
	ctx := context.Background()
	start := clk.Now()
	const steps = 50
	rate := map[string]int{"f1": 300, "f2": 300, "f3": 300}
	for i := 1; i <= 10; i++ {
		rate[fmt.Sprintf("l%02d", i)] = 2 * i
	}
	credit := map[string]float64{} // half an event ahead: events mid-way, not at the window's end
	for ten := range rate {
		credit[ten] = 0.5
	}
	for sec := 0; sec < 8; sec++ {
		for k := 0; k < steps; k++ {
			clk.Set(start.Add(time.Duration(sec)*time.Second + time.Duration(k)*time.Second/steps))
			var batch []string
			var costs []Cost
			for _, ten := range slices.Sorted(maps.Keys(rate)) {
				credit[ten] += float64(rate[ten]) / steps
				for ; credit[ten] >= 1; credit[ten]-- {
					batch = append(batch, ten)
					costs = append(costs, Cost{Bytes: size(ten)})
				}
			}
			if _, err := l.AdmitCosts(ctx, batch, costs); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The demand histograms sit where keys.go says, and expire.
	dk := l.keys.capacity(c[0]) + CapacityDemandSuffix + WindowSep + strconv.FormatInt(start.Add(3*time.Second).UnixMilli(), 10)
	if ttl, err := l.rdb.PTTL(ctx, dk).Result(); err != nil || ttl <= 0 {
		t.Errorf("demand histogram %s: ttl %v (%v), want a key that expires", dk, ttl, err)
	}
	for sec := 2; sec < 8; sec++ {
		s := start.Add(time.Duration(sec) * time.Second)
		count, _, booked := capWindow(t, l, c[0], s)
		refused := capRefused(t, l, c[0], s)
		asked := map[string]int64{}
		for ten := range rate {
			asked[ten] = booked[ten] + refused[ten]
		}
		want, level := testenv.WaterFill(asked, C)
		t.Logf("second %d: count %d, level %.1f, floods booked %d %d %d", sec, count, level, booked["f1"], booked["f2"], booked["f3"])
		if count > C || count < C-size("f1") {
			t.Errorf("second %d: count %d, want %d (within one event)", sec, count, C)
		}
		for ten, w := range want {
			if got := float64(booked[ten]); math.Abs(got-w) > math.Max(float64(size(ten)), 0.05*w)+float64(slack*size(ten)) {
				t.Errorf("second %d: %s booked %v, want %.1f (asked %d)", sec, ten, got, w, asked[ten])
			}
		}
	}
}

// capRefused reads what each tenant was refused in a capacity window.
func capRefused(t testing.TB, l *Limiter, r Rule, start time.Time) map[string]int64 {
	t.Helper()
	h, err := l.rdb.HGetAll(context.Background(), l.keys.capacity(r)+WindowSep+strconv.FormatInt(start.UnixMilli(), 10)).Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for k, v := range h {
		if strings.HasPrefix(k, "r:") {
			out[k[2:]], _ = strconv.ParseInt(v, 10, 64)
		}
	}
	return out
}

// TestCapacityZone: hour, day and week windows of a capacity need a zone
// whose offset from UTC does not change (the script steps them by their
// length); seconds and minutes go anywhere.
func TestCapacityZone(t *testing.T) {
	now := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	paris, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		t.Skip(err)
	}
	kolkata, _ := time.LoadLocation("Asia/Kolkata")
	for _, tc := range []struct {
		capacity string
		loc      *time.Location
		ok       bool
	}{
		{"100/1h", time.UTC, true},
		{"100/1h", kolkata, true},
		{"100/1h", paris, false},
		{"100/1s,6000/1m", paris, true},
		{"100/1d", kolkata, true},
		{"100/1d", paris, false},
		{"100/1w", time.UTC, true},
		{"100/1s,100/1w", paris, false},
	} {
		c, err := ParseCapacity(tc.capacity)
		if err != nil {
			t.Fatal(err)
		}
		err = CheckCapacityZone(c, tc.loc, now)
		if (err == nil) != tc.ok {
			t.Errorf("%s in %s: got %v, want ok %v", tc.capacity, tc.loc, err, tc.ok)
		}
	}
}

// TestCapacityDayAndWeek: capacity windows of a day and of a week start at
// local midnight (a week on Monday) in a zone without daylight saving, hold
// their capacity, and what is over it is deferred to the next one's start
// (one event: a tenant alone books at most part of a future window, as in
// windows of seconds).
func TestCapacityDayAndWeek(t *testing.T) {
	kolkata, err := time.LoadLocation("Asia/Kolkata")
	if err != nil {
		t.Skip(err)
	}
	rdb := testRedis(t)
	now := time.Date(2026, 12, 2, 15, 0, 0, 0, kolkata) // a Wednesday afternoon
	for _, tc := range []struct {
		capacity         string
		start, next      time.Time
		admitted, events int
	}{
		{"3/1d", time.Date(2026, 12, 2, 0, 0, 0, 0, kolkata), time.Date(2026, 12, 3, 0, 0, 0, 0, kolkata), 3, 4},
		{"4/1w", time.Date(2026, 11, 30, 0, 0, 0, 0, kolkata), time.Date(2026, 12, 7, 0, 0, 0, 0, kolkata), 4, 5},
	} {
		t.Run(tc.capacity, func(t *testing.T) {
			clk := newFakeClock(now)
			c, err := ParseCapacity(tc.capacity)
			if err != nil {
				t.Fatal(err)
			}
			l := newTestLimiter(t, rdb, "*=1000/1h", Options{Clock: clk.Now, Location: kolkata, Capacity: c, Horizon: 8 * 24 * time.Hour})
			ds := admit(t, l, repeat("a", tc.events))
			want := strings.Repeat("a", tc.admitted) + strings.Repeat("d", tc.events-tc.admitted)
			if got := kinds(ds); got != want {
				t.Fatalf("got %s, want %s", got, want)
			}
			for _, d := range ds[tc.admitted:] {
				if !d.Due.Equal(tc.next) {
					t.Errorf("deferred to %v, want the next window's start %v", d.Due.In(kolkata), tc.next)
				}
			}
			if count, _, _ := capWindow(t, l, c[0], tc.start); count != int64(tc.admitted) {
				t.Errorf("window of %v: count %d, want %d", tc.start, count, tc.admitted)
			}
			if count, _, _ := capWindow(t, l, c[0], tc.next); count != int64(tc.events-tc.admitted) {
				t.Errorf("window of %v: count %d, want %d", tc.next, count, tc.events-tc.admitted)
			}
		})
	}
}
