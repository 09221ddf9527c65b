package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"
)

// Tokens of the override tests: one that writes, one that reads.
const (
	ovWriteToken = "ops-token-0123456789abcdef"
	ovReadToken  = "viewer-token-0123456789abc"
)

func ovTokensEnv() []string {
	return []string{"GATEKEEPER_ADMIN_TOKENS", "ops:write:" + ovWriteToken + ",viewer:read:" + ovReadToken}
}

// ovDo sends method path with a JSON body to p as token and decodes the
// answer into out (when not nil) if its status is 2xx; it returns the status.
func ovDo(t testing.TB, p *gkProc, token, method, path string, body, out any) int {
	t.Helper()
	st, data := ovSend(t, p, token, method, path, body)
	if out != nil && st/100 == 2 {
		if err := json.Unmarshal(data, out); err != nil {
			t.Fatalf("%s %s: %v: %s", method, path, err, data)
		}
	}
	return st
}

// ovSend sends method path with a JSON body (nil: none) to p as token and
// returns the status and the body of the answer.
func ovSend(t testing.TB, p *gkProc, token, method, path string, body any) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, "http://"+p.HTTP+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	c := http.Client{Timeout: 5 * time.Second}
	res, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	data, _ := io.ReadAll(res.Body)
	return res.StatusCode, data
}

type ovView struct {
	Override *struct {
		Version int64    `json:"version"`
		Rules   []string `json:"rules"`
	} `json:"override"`
	RulesInForce   []string `json:"rules_in_force"`
	AppliedVersion int64    `json:"applied_version"`
}

func ovInForce(t testing.TB, p *gkProc, tenant string) ovView {
	var v ovView
	if st := ovDo(t, p, ovReadToken, "GET", "/v1/overrides/"+url.PathEscape(tenant), nil, &v); st != 200 {
		t.Fatalf("GET override %s: status %d", tenant, st)
	}
	return v
}

// ovSlowlog prints the slowest Redis calls since start of the override
// scripts and top publishing, and fails above a generous ceiling.
func ovSlowlog(t *testing.T, prefix string) {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr()})
	defer rdb.Close()
	logs, err := rdb.SlowLogGet(context.Background(), 128).Result()
	if err != nil {
		t.Fatalf("slowlog: %v", err)
	}
	var slowest time.Duration
	var what string
	for _, l := range logs {
		if strings.Contains(strings.Join(l.Args, " "), prefix) && l.Duration > slowest {
			slowest, what = l.Duration, strings.Join(l.Args[:min(3, len(l.Args))], " ")
		}
	}
	t.Logf("slowest Redis call of this test in SLOWLOG: %v %s", slowest, what)
	if slowest > 50*time.Millisecond {
		t.Errorf("a Redis call took %v (%s), over the 50ms ceiling", slowest, what)
	}
}

// TestOverridePropagationThreeReplicas writes overrides through each of
// three replicas and measures how soon every replica enforces them; then
// checks the refused stale write, the scopes, expiry and the audit trail.
func TestOverridePropagationThreeReplicas(t *testing.T) {
	f := newFlow(t, 3)
	env := f.env(t, append(ovTokensEnv(), "GATEKEEPER_LIMITS", "*=5/1m")...)
	var procs []*gkProc
	for i := range 3 {
		procs = append(procs, startGatekeeper(t, fmt.Sprintf("gk%d", i), env))
	}
	for _, p := range procs {
		p.waitReady(90 * time.Second)
	}

	// Propagation: each write through one replica, polled on all three.
	const writes = 40
	var lat []time.Duration
	for i := range writes {
		tenant := fmt.Sprintf("prop-%d", i)
		rule := fmt.Sprintf("%d/1m", 100+i)
		t0 := time.Now()
		var rec struct{ Version int64 }
		body := map[string]any{"rules": []string{rule}, "reason": "propagation test", "version": 0}
		if st := ovDo(t, procs[i%3], ovWriteToken, "PUT", "/v1/overrides/"+tenant, body, &rec); st != 200 {
			t.Fatalf("PUT %s: status %d", tenant, st)
		}
		var mu sync.Mutex
		var wg sync.WaitGroup
		for _, p := range procs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Since(t0) < 10*time.Second {
					if v := ovInForce(t, p, tenant); slices.Equal(v.RulesInForce, []string{rule}) {
						mu.Lock()
						lat = append(lat, time.Since(t0))
						mu.Unlock()
						return
					}
					time.Sleep(5 * time.Millisecond)
				}
				t.Errorf("%s: %s not in force after 10s", p.Name, tenant)
			}()
		}
		wg.Wait()
	}
	slices.Sort(lat)
	p50, p99 := lat[len(lat)/2], lat[(len(lat)*99+99)/100-1]
	t.Logf("propagation over %d replica applications (write to in force on each of 3 replicas, 5ms polling): p50 %v, p99 %v, max %v",
		len(lat), p50.Round(time.Millisecond), p99.Round(time.Millisecond), lat[len(lat)-1].Round(time.Millisecond))
	if p99 > time.Second {
		t.Errorf("propagation p99 %v, want at most 1s", p99)
	}

	// A stale write is refused, not merged: the API answers 409 with the
	// current version, the CLI exits 3, and the override is unchanged.
	stale := map[string]any{"rules": []string{"1/1m"}, "reason": "stale", "version": 0}
	if st := ovDo(t, procs[1], ovWriteToken, "PUT", "/v1/overrides/prop-0", stale, nil); st != http.StatusConflict {
		t.Errorf("stale PUT: status %d, want 409", st)
	}
	cli := map[string]string{"GATEKEEPER_URL": "http://" + procs[2].HTTP, "GATEKEEPER_TOKEN": ovWriteToken}
	out, errOut, code := opsRun(t, cli, "override", "set", "prop-0", "2/1m", "--reason", "stale from the CLI", "--version", "0")
	if code != 3 || !strings.Contains(errOut, "stale version") {
		t.Errorf("CLI stale set: exit %d, stderr %q, stdout %q; want exit 3 and a stale version message", code, errOut, out)
	}
	if v := ovInForce(t, procs[0], "prop-0"); !slices.Equal(v.RulesInForce, []string{"100/1m"}) || v.Override.Version != 1 {
		t.Errorf("after stale writes: %+v, want 100/1m at version 1", v)
	}
	// gatekeeper usage reads Redis directly, and shows the override's rules too.
	out, errOut, code = opsRun(t, map[string]string{"GATEKEEPER_LIMITS": "*=5/1m", "GATEKEEPER_REDIS_KEY_PREFIX": env["GATEKEEPER_REDIS_KEY_PREFIX"]}, "usage", "prop-0")
	if code != 0 || !strings.Contains(out, `"rule": "100/1m"`) {
		t.Errorf("gatekeeper usage prop-0: exit %d: %s %s; want the rule 100/1m", code, out, errOut)
	}
	// The read token may read, not write.
	if st := ovDo(t, procs[0], ovReadToken, "PUT", "/v1/overrides/x", map[string]any{"rules": []string{"1/1m"}, "reason": "r", "version": 0}, nil); st != http.StatusForbidden {
		t.Errorf("PUT with the read token: status %d, want 403", st)
	}

	// Expiry: set through the CLI with --expires 2s; within a second of
	// the expiry every replica is back to the base rules.
	out, errOut, code = opsRun(t, cli, "override", "set", "cut", "0/1m", "--reason", "misbehaving", "--expires", "2s")
	if code != 0 {
		t.Fatalf("CLI set with expiry: exit %d: %s %s", code, out, errOut)
	}
	var set struct {
		Expires time.Time `json:"expires"`
	}
	if err := json.Unmarshal([]byte(out), &set); err != nil {
		t.Fatalf("CLI set output: %v: %s", err, out)
	}
	for _, p := range procs {
		waitFor(t, 5*time.Second, p.Name+": cut in force", func() (bool, string) {
			v := ovInForce(t, p, "cut")
			return slices.Equal(v.RulesInForce, []string{"0/1m"}), fmt.Sprint(v.RulesInForce)
		})
	}
	var back []time.Duration
	for _, p := range procs {
		for {
			v := ovInForce(t, p, "cut")
			if slices.Equal(v.RulesInForce, []string{"5/1m"}) {
				back = append(back, time.Since(set.Expires))
				break
			}
			if time.Since(set.Expires) > 5*time.Second {
				t.Fatalf("%s: cut still %v 5s after its expiry", p.Name, v.RulesInForce)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	t.Logf("expiry honoured on the three replicas %v after the expiry time", back)
	for _, b := range back {
		if b > time.Second {
			t.Errorf("expiry honoured %v late, want within 1s", b)
		}
	}

	// The other commands as the README writes them: a dry run writes
	// nothing and shows the counts against the new rules; get, list and
	// delete.
	out, errOut, code = opsRun(t, cli, "override", "set", "prop-1", "7/1m", "--reason", "try", "--dry-run")
	if code != 0 || !strings.Contains(out, "dry run for prop-1") || !strings.Contains(out, "new  7/1m") || !strings.Contains(out, "now  101/1m") {
		t.Errorf("dry run: exit %d:\n%s%s", code, out, errOut)
	}
	if v := ovInForce(t, procs[0], "prop-1"); v.Override.Version != 2 {
		t.Errorf("the dry run wrote: %+v", v)
	}
	out, _, code = opsRun(t, cli, "override", "get", "prop-1")
	if code != 0 || !strings.Contains(out, `"rules_in_force": [`) || !strings.Contains(out, `"101/1m"`) {
		t.Errorf("get: exit %d:\n%s", code, out)
	}
	out, _, code = opsRun(t, cli, "override", "list")
	if n := strings.Count(out, "propagation test"); code != 0 || n != writes {
		t.Errorf("list: exit %d, %d overrides of the propagation, want %d:\n%s", code, n, writes, out)
	}
	out, errOut, code = opsRun(t, cli, "override", "delete", "prop-1", "--reason", "done")
	if code != 0 || !strings.Contains(out, `"deleted": true`) {
		t.Errorf("delete: exit %d: %s %s", code, out, errOut)
	}
	for _, p := range procs {
		waitFor(t, 2*time.Second, p.Name+": prop-1 back to the base rules", func() (bool, string) {
			v := ovInForce(t, p, "prop-1")
			return slices.Equal(v.RulesInForce, []string{"5/1m"}), fmt.Sprint(v.RulesInForce)
		})
	}

	// A shadow override counts and reports, and does not enforce: shady's 5
	// events all go downstream under 5/1m, while the shadow 1/1m would have
	// admitted one and deferred four.
	out, errOut, code = opsRun(t, cli, "override", "set", "shady", "1/1m", "--reason", "try 1/1m", "--shadow")
	if code != 0 {
		t.Fatalf("shadow set: exit %d: %s %s", code, out, errOut)
	}
	for _, p := range procs {
		waitFor(t, 2*time.Second, p.Name+": the shadow override applied", func() (bool, string) {
			n := p.metric(t, "gatekeeper_overrides", `kind="shadow"`)
			return n == 1, fmt.Sprint(n)
		})
	}
	var shady []kafka.Message
	for i := range 5 {
		shady = append(shady, kafka.Message{Key: []byte("shady"), Value: ev{ID: 1000 + i}.value()})
	}
	produce(t, f.Source, shady)
	waitFor(t, 20*time.Second, "shady's 5 events downstream", func() (bool, string) {
		o := readOutputs(t, f)
		return opsCountKey(o.down, "shady") == 5, o.String()
	})
	var sAdmit, sDefer float64
	for _, p := range procs {
		sAdmit += p.metric(t, "gatekeeper_override_shadow_decisions_total", `decision="admit"`)
		sDefer += p.metric(t, "gatekeeper_override_shadow_decisions_total", `decision="defer"`)
	}
	if sAdmit != 1 || sDefer != 4 {
		t.Errorf("shadow decisions: admit %v, defer %v; want 1 and 4", sAdmit, sDefer)
	}

	// The audit trail: who (token name), when, why, before and after.
	waitFor(t, 5*time.Second, "the expiry in the audit", func() (bool, string) {
		out, _, _ := opsRun(t, cli, "override", "audit", "cut")
		return strings.Contains(out, " expire "), out
	})
	out, _, code = opsRun(t, cli, "override", "audit", "cut")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 3 || !strings.Contains(lines[1], "expire") || !strings.Contains(lines[1], "expiry") ||
		!strings.Contains(lines[2], "set") || !strings.Contains(lines[2], "ops") || !strings.Contains(lines[2], "misbehaving") || !strings.Contains(lines[2], "0/1m") {
		t.Errorf("audit of cut: exit %d:\n%s\nwant the set by ops (misbehaving, 0/1m), then the expiry", code, out)
	}
	var audit struct {
		Entries []struct {
			Version int64                     `json:"version"`
			Op      string                    `json:"op"`
			By      string                    `json:"by"`
			Reason  string                    `json:"reason"`
			Before  *struct{ Rules []string } `json:"before"`
		} `json:"entries"`
	}
	if st := ovDo(t, procs[1], ovReadToken, "GET", "/v1/audit?tenant=prop-0", nil, &audit); st != 200 || len(audit.Entries) != 1 || audit.Entries[0].Reason != "propagation test" {
		t.Errorf("audit of prop-0 from the API: status %d %+v, want the one set (the stale writes are not changes)", st, audit)
	}
	ovSlowlog(t, keyPrefix(t))
}

// TestOverrideRaiseMovesBacklogForward defers a tenant's events under a low
// limit (30 events under 5/1m: 25 reserved over the next five minutes, in
// the first retry tier and in the hour tier, most beyond a look-ahead of 3
// events per partition), raises the limit, and checks that the deferred
// events are forwarded before their reserved slots where the raised rules
// have room in the current window, never beyond them, and that Redis counts
// each event once (the slots of the events admitted early are given back).
// The raise comes from an override (to 100/1m: all 25 early) or from a
// LIMITS_FILE reload (to 15/1m: 10 early, the 15 others checked once and
// each given the earliest slot the new rules allow: all in the next
// minute, those reserved later under 5/1m moved there, their old slots
// given back; then forwarded there, none before its slot).
func TestOverrideRaiseMovesBacklogForward(t *testing.T) {
	for _, c := range []struct {
		name      string
		limit     int // the raised limit per minute
		early     int
		fileRaise bool
	}{
		{"override", 100, 25, false},
		{"limits file", 15, 10, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFlow(t, 1)
			// At least 20s left in this minute, so that the reservations all
			// lie in later windows when the limit is raised.
			if s := time.Now().Second(); s > 35 {
				time.Sleep(time.Duration(61-s) * time.Second)
			}
			prefix := keyPrefix(t)
			ld := &opsLimitsDir{t: t, dir: t.TempDir()}
			ld.write("default: [5/1m]\n")
			env := f.env(t, append(ovTokensEnv(), "GATEKEEPER_LIMITS_FILE", ld.file(), "GATEKEEPER_REDIS_KEY_PREFIX", prefix,
				"GATEKEEPER_RETRY_LOOKAHEAD", "3")...)
			p := startGatekeeper(t, "gk", env)
			p.waitReady(90 * time.Second)
			var msgs []kafka.Message
			for i := range 30 {
				msgs = append(msgs, kafka.Message{Key: []byte("acme"), Value: ev{ID: i}.value()})
			}
			produce(t, f.Source, msgs)
			waitFor(t, 30*time.Second, "5 admitted and 25 deferred", func() (bool, string) {
				out := readOutputs(t, f)
				return len(out.down) == 5 && len(out.retry) >= 25, out.String()
			})
			waitFor(t, 30*time.Second, "the look-ahead full", func() (bool, string) {
				n := p.metric(t, "gatekeeper_deferred_waiting")
				return n >= 3, fmt.Sprint(n)
			})
			t.Logf("waiting in the retry consumers' look-ahead at the raise: %v of 25", p.metric(t, "gatekeeper_deferred_waiting"))
			raised := time.Now()
			if c.fileRaise {
				ld.write(fmt.Sprintf("default: [%d/1m]\n", c.limit))
			} else {
				body := map[string]any{"rules": []string{fmt.Sprintf("%d/1m", c.limit)}, "reason": "customer escalation", "version": 0}
				if st := ovDo(t, p, ovWriteToken, "PUT", "/v1/overrides/acme", body, nil); st != 200 {
					t.Fatalf("PUT: status %d", st)
				}
			}
			var out outputs
			waitFor(t, 20*time.Second, fmt.Sprintf("%d downstream", 5+c.early), func() (bool, string) {
				out = readOutputs(t, f)
				return len(out.down) == 5+c.early && p.metric(t, "gatekeeper_decisions_total", "decision", "admit_early") == float64(c.early), out.String()
			})
			// Nothing more comes early: the others wait for their slots.
			time.Sleep(2 * time.Second)
			out = readOutputs(t, f)
			early := 0
			for _, m := range out.down {
				var ms int64
				if due := header(m, "gk-due"); due != "" {
					fmt.Sscan(due, &ms)
					if m.Time.Before(time.UnixMilli(ms)) {
						early++
					}
				}
			}
			checked := 0
			for _, m := range out.retry {
				if header(m, "gk-checked") != "" {
					checked++
				}
			}
			t.Logf("after the raise at %s: %d of 25 deferred events forwarded before their reserved slots, %d downstream in all (%v after the raise); %d checked and sent back to their slots",
				raised.Format("15:04:05.000"), early, len(out.down), time.Since(raised).Round(time.Millisecond), checked)
			if early != c.early || len(out.down) != 5+c.early {
				t.Errorf("got %s, %d downstream before their due time; want %d downstream, %d early", out, early, 5+c.early, c.early)
			}
			if checked != 25-c.early {
				t.Errorf("%d copies with gk-checked in the retry tiers, want %d (each event that found no room checked once)", checked, 25-c.early)
			}
			// The events that found no room now took the earliest slot the
			// rules in force allow: the next minute holds room for all of
			// them (15 of 15), so each is due there, moved when its old
			// slot was later, its old slot given back.
			cur := raised.Truncate(time.Minute)
			firstDue := map[string]string{} // origin offset -> gk-due of its first deferral
			for _, m := range out.retry {
				if header(m, "gk-checked") == "" {
					firstDue[header(m, "gk-origin-offset")] = header(m, "gk-due")
				}
			}
			moved := 0
			for _, m := range out.retry {
				if header(m, "gk-checked") == "" {
					continue
				}
				due, old := header(m, "gk-due"), firstDue[header(m, "gk-origin-offset")]
				if due != old {
					moved++
				}
				if want := strconv.FormatInt(cur.Add(time.Minute).UnixMilli(), 10); due != want {
					t.Errorf("event at origin offset %s: due %s after the check (first deferred to %s), want %s, the next minute's start",
						header(m, "gk-origin-offset"), due, old, want)
				}
			}
			t.Logf("%d of the %d events without room now moved to an earlier slot (the others' slots were already in the next minute)", moved, 25-c.early)
			if n := p.metric(t, "gatekeeper_decisions_total", "decision", "moved_forward"); n != float64(moved) {
				t.Errorf("moved_forward counted %v, want %d", n, moved)
			}
			if c.fileRaise && moved == 0 {
				t.Error("no event moved forward: 15 events under 5/1m hold slots up to four minutes ahead, and 15/1m has room for all in the next minute")
			}
			// Never over the rules in force, and each event counted once:
			// the windows of acme hold 30 in all (the current one 5+early,
			// the next one the others, the slots of those admitted early or
			// moved given back).
			var sum, now, next int64
			for _, w := range readWindows(t, redisAddr(), prefix) {
				if w.Tenant != "acme" {
					continue
				}
				sum += w.Count
				if w.Count > int64(c.limit) {
					t.Errorf("acme's window at %d counts %d, over %d", w.Start, w.Count, c.limit)
				}
				switch w.Start {
				case cur.UnixMilli():
					now = w.Count
				case cur.Add(time.Minute).UnixMilli():
					next = w.Count
				}
			}
			if sum != 30 || now != int64(5+c.early) || next != int64(25-c.early) {
				t.Errorf("acme's windows count %d in all, %d in the current one and %d in the next; want 30 (each event once), %d and %d",
					sum, now, next, 5+c.early, 25-c.early)
			}
			if n := p.metric(t, "gatekeeper_released_slots_total"); n != float64(c.early+moved) {
				t.Errorf("gatekeeper_released_slots_total = %v, want %d", n, c.early+moved)
			}
			if c.early < 25 {
				// All forwarded in the next minute, none before its slot.
				waitFor(t, 90*time.Second, "all 30 downstream", func() (bool, string) {
					out = readOutputs(t, f)
					return len(out.down) == 30, out.String()
				})
				for _, m := range out.down {
					var ms int64
					fmt.Sscan(header(m, "gk-due"), &ms)
					if ms > 0 && m.Time.Before(time.UnixMilli(ms)) && header(m, "gk-checked") != "" {
						t.Errorf("event at origin offset %s forwarded at %s, before its slot at %s", header(m, "gk-origin-offset"),
							m.Time.Format("15:04:05.000"), time.UnixMilli(ms).Format("15:04:05.000"))
					}
				}
			}
			ovSlowlog(t, prefix)
		})
	}
}

// TestTopInTerminal runs gatekeeper top in a terminal (tmux) and as plain
// output, against a replica that defers and rejects.
func TestTopInTerminal(t *testing.T) {
	if _, err := exec.LookPath("tmux"); err != nil {
		t.Fatal("tmux is needed for the terminal view")
	}
	f := newFlow(t, 1)
	env := f.env(t, append(ovTokensEnv(), "GATEKEEPER_LIMITS", "*=5/1m;bulk=2/1m", "GATEKEEPER_DEFER_HORIZON", "2m")...)
	p := startGatekeeper(t, "gk", env)
	p.waitReady(90 * time.Second)
	var msgs []kafka.Message
	for i := range 40 {
		msgs = append(msgs, kafka.Message{Key: []byte("bulk"), Value: []byte(fmt.Sprint(i))})
	}
	for i := range 3 {
		msgs = append(msgs, kafka.Message{Key: []byte("light"), Value: []byte(fmt.Sprint(i))})
	}
	produce(t, f.Source, msgs)
	if st := ovDo(t, p, ovWriteToken, "PUT", "/v1/overrides/light", map[string]any{"rules": []string{"50/1m"}, "reason": "vip", "version": 0}, nil); st != 200 {
		t.Fatalf("PUT: %d", st)
	}
	cli := map[string]string{"GATEKEEPER_URL": "http://" + p.HTTP, "GATEKEEPER_TOKEN": ovReadToken}
	// Plain output (not a terminal): printed once.
	waitFor(t, 20*time.Second, "bulk in the plain top", func() (bool, string) {
		out, _, code := opsRun(t, cli, "top")
		return code == 0 && strings.Contains(out, "bulk") && strings.Contains(out, "light"), out
	})
	out, _, _ := opsRun(t, cli, "top", "--sort", "rejected")
	t.Logf("gatekeeper top, piped:\n%s", out)
	if strings.Contains(out, "\x1b[") {
		t.Errorf("plain top holds escape sequences: %q", out)
	}
	bulk := regexpRow(out, "bulk")
	if len(bulk) < 5 || bulk[1] != "2" || bulk[2] != "4" || bulk[3] != "34" {
		t.Errorf("bulk row %q, want 2 admitted, 4 deferred (2 a window in the 2m horizon), 34 rejected:\n%s", bulk, out)
	}
	if !strings.Contains(regexpLine(out, "light"), "v1") {
		t.Errorf("light's row does not show its override v1:\n%s", out)
	}
	// In a terminal: refreshed in place.
	sock := "gkt-" + uniqueName(t)
	args := []string{"-L", sock, "new-session", "-d", "-s", "top", "-x", "160", "-y", "40", "env",
		"GATEKEEPER_URL=" + cli["GATEKEEPER_URL"], "GATEKEEPER_TOKEN=" + ovReadToken, gatekeeperBinary(t), "top", "--interval", "200ms"}
	if b, err := exec.Command("tmux", args...).CombinedOutput(); err != nil {
		t.Fatalf("tmux: %v: %s", err, b)
	}
	t.Cleanup(func() { exec.Command("tmux", "-L", sock, "kill-server").Run() })
	capture := func() string {
		b, _ := exec.Command("tmux", "-L", sock, "capture-pane", "-p", "-t", "top").Output()
		return string(b)
	}
	var first string
	waitFor(t, 10*time.Second, "the view in the terminal", func() (bool, string) {
		first = capture()
		return strings.Contains(first, "bulk") && strings.Contains(first, "Ctrl-C quits"), first
	})
	waitFor(t, 10*time.Second, "a refresh (the clock moves)", func() (bool, string) {
		c := capture()
		return strings.SplitN(c, "\n", 2)[0] != strings.SplitN(first, "\n", 2)[0] && strings.Contains(c, "bulk"), c
	})
	if n := strings.Count(capture(), "gatekeeper top -"); n != 1 {
		t.Errorf("the terminal shows %d headers, want 1 (redrawn in place):\n%s", n, capture())
	}
}

func regexpLine(out, tenant string) string {
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 0 && f[0] == tenant {
			return l
		}
	}
	return ""
}

// regexpRow returns the first row of tenant in the current window: its fields.
func regexpRow(out, tenant string) []string {
	return strings.Fields(regexpLine(out, tenant))
}
