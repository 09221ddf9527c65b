package worker

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unicode"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
	"github.com/gatekeeper-dev/gatekeeper/internal/testenv"
)

// ruleMap shows rules as tenant -> rule strings ("*" for the fallback) for comparison.
func ruleMap(rs *limit.Rules, probe ...string) map[string][]string {
	out := map[string][]string{}
	add := func(key, tenant string) {
		for _, r := range rs.For(tenant) {
			out[key] = append(out[key], r.String())
		}
	}
	for _, t := range rs.Tenants() {
		add(t, t)
	}
	add("*", "\x00no such tenant\x00")
	for _, p := range probe {
		add("probe:"+p, p)
	}
	return out
}

func TestParseLimitsFile(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want map[string][]string
	}{
		{
			name: "example",
			yaml: `
default: [100/1m]
tenants:
  acme: [1000/1m, 50000/1d]
  "weird tenant/with:chars": [10/1s]
`,
			want: map[string][]string{
				"*":                       {"100/1m"},
				"acme":                    {"1000/1m", "50000/1d"},
				"weird tenant/with:chars": {"10/1s"},
			},
		},
		{
			name: "block lists and string form",
			yaml: "tenants:\n  acme:\n    - 5/1s\n    - 100/1h\n  beta: 7/1m, 9/1d\n  \"caf\u00e9 ;*\": 1/1s\n",
			want: map[string][]string{
				"acme":         {"5/1s", "100/1h"},
				"beta":         {"7/1m", "9/1d"},
				"caf\u00e9 ;*": {"1/1s"},
			},
		},
		{
			name: "default only",
			yaml: "default: [3/1w]\n",
			want: map[string][]string{"*": {"3/1w"}},
		},
		{
			name: "aliases and an explicit document start",
			yaml: "---\ndefault: &std [3/1m]\ntenants:\n  acme: *std\n",
			want: map[string][]string{"*": {"3/1m"}, "acme": {"3/1m"}},
		},
		{
			name: "longest windows",
			yaml: "tenants:\n  a: [1/366d, 2/52w, 3/12mo, 4/8784h]\n",
			want: map[string][]string{"a": {"1/366d", "2/52w", "3/12mo", "4/8784h"}},
		},
		{
			name: "bytes and units",
			yaml: "default: [100/1m, 10MiB/1m]\ntenants:\n  acme: 1000/1m, 10MiB/1m, 2GiB/1d\n  meter: [5000u/1m, 500KB/1s]\n",
			want: map[string][]string{
				"*":     {"100/1m", "10MiB/1m"},
				"acme":  {"1000/1m", "10MiB/1m", "2GiB/1d"},
				"meter": {"5000u/1m", "500KB/1s"},
			},
		},
		{
			name: "numeric tenant name",
			yaml: "tenants:\n  42: [1/1s]\n",
			want: map[string][]string{"42": {"1/1s"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rs, err := parseLimitsFile([]byte(tt.yaml))
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, ruleMap(rs)); diff != "" {
				t.Errorf("rules (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseLimitsFileErrors(t *testing.T) {
	tests := []struct {
		name, yaml, wantIn string
	}{
		{"empty", "", "no rules"},
		{"only comments", "# nothing\n", "no rules"},
		{"bad rule", "tenants:\n  acme: [lots]\n", `"lots"`},
		{"bad unit", "default: [10/1y]\n", `"y"`},
		{"unknown key", "default: [1/1m]\ndefaults: [10/1m]\n", "line 2, column 1: unknown key (want default: or tenants:)"},
		{"key twice", "default: [1/1m]\ndefault: [10/1m]\n", "line 2, column 1: key given twice"},
		{"not a mapping", "[1/1m]\n", "line 1, column 1: want a mapping"},
		{"tenants not a mapping", "tenants: [1/1m]\n", "tenants: want a mapping"},
		{"second document", "default: [1/1m]\n---\ndefault: [2/1m]\n", "a second YAML document (want one)"},
		{"second document of garbage", "default: [1/1m]\n---\n{{{:\n", "bad YAML: line 2: did not find expected node content"},
		{"equals in tenant", "tenants:\n  \"a=b\": [1/1s]\n", `tenant "a=b": must not hold "="`},
		{"control byte in tenant", "tenants:\n  \"a\\eb\": [1/1s]\n", `tenant "a\x1bb": must not hold control characters`},
		{"window over a year", "tenants:\n  acme: [1/400d]\n", `tenant "acme": rule "1/400d": window longer than a year`},
		{"ttl overflow", "default: 10/213504d\n", `default: rule "10/213504d": window longer than a year`},
		{"star tenant", "tenants:\n  \"*\": [1/1s]\n", "default:"},
		{"empty list", "tenants:\n  acme: []\n", "empty rule list"},
		{"null list", "tenants:\n  acme:\n", "no rules"},
		{"map as rules", "tenants:\n  acme: {a: b}\n", "list of rules"},
		{"duplicate tenant", "tenants:\n  acme: [1/1s]\n  acme: [2/1s]\n", "acme"},
		{"duplicate window", "tenants:\n  acme: [1/1s, 2/1s]\n", "two rules"},
		{"not yaml", "tenants: [\n", "bad YAML"},
		{"long tenant", "tenants:\n  " + strings.Repeat("x", 257) + ": [1/1s]\n", "256"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseLimitsFile([]byte(tt.yaml))
			if err == nil {
				t.Fatalf("got no error, want one containing %q", tt.wantIn)
			}
			if !strings.Contains(err.Error(), tt.wantIn) {
				t.Errorf("got %q, want it to contain %q", err, tt.wantIn)
			}
			if strings.ContainsAny(err.Error(), "\n") {
				t.Errorf("got %q, want one line", err)
			}
			if strings.ContainsFunc(err.Error(), unicode.IsControl) {
				t.Errorf("got %q, want no control characters", err)
			}
		})
	}
}

// TestParseLimitsFileQuotesNoContent feeds files that are not rules (a
// password file, secrets) and checks that the errors quote none of them.
// (Once the file has the shape of rules, errors quote the bad tenant or
// rule, escaped, as LIMITS's do.)
func TestParseLimitsFileQuotesNoContent(t *testing.T) {
	tests := []struct{ name, yaml, want string }{
		{"passwd", "root:x:0:0:root:/root:/bin/bash\nsecret:x:1:1:hunter2:/usr/sbin:/usr/sbin/nologin\n", "line 1, column 1: want a mapping"},
		{"unknown key", "secret: hunter2\n", "line 1, column 1: unknown key"},
		{"unclosed list", "default: [secret, hunter2\n", "bad YAML: line 1: not valid YAML"},
		{"unknown anchor", "default: *secret\n", "bad YAML: not valid YAML"},
		{"tab", "default:\n\tsecret: hunter2\n", "bad YAML: line 2: found character that cannot start any token"},
		{"rule item a mapping", "default: [{secret: hunter2}]\n", "line 1, column 11: want a rule like 100/1m"},
		{"tenant key a list", "tenants:\n  [secret, hunter2]: [1/1m]\n", "line 2, column 3: want a tenant name"},
		{"second document", "default: [1/1m]\n---\nsecret hunter2\n", "line 2, column 1: a second YAML document"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseLimitsFile([]byte(tt.yaml))
			if err == nil {
				t.Fatalf("got no error, want one containing %q", tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %q, want it to contain %q", err, tt.want)
			}
			for _, secret := range []string{"secret", "hunter2", "root"} {
				if strings.Contains(err.Error(), secret) {
					t.Errorf("got %q, which quotes %q from the file", err, secret)
				}
			}
		})
	}
}

// applied records the rules a Watcher applies. Safe for concurrent use.
type applied struct {
	mu    sync.Mutex
	rules []*limit.Rules
	fail  error
}

func (a *applied) apply(r *limit.Rules) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.fail != nil {
		return a.fail
	}
	a.rules = append(a.rules, r)
	return nil
}

func (a *applied) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.rules)
}

func (a *applied) last() *limit.Rules {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.rules) == 0 {
		return nil
	}
	return a.rules[len(a.rules)-1]
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// eventually polls cond for up to 5s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestWatcher(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "limits.yaml")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// replace writes a new file and renames it over the old, as editors and
	// config management do.
	replace := func(s string) {
		t.Helper()
		tmp := filepath.Join(dir, ".limits.yaml.tmp")
		if err := os.WriteFile(tmp, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	write("default: [100/1m]\n")

	var a applied
	reg := prometheus.NewRegistry()
	w, err := NewWatcher(path, a.apply, testenv.DiscardLogger(), reg)
	if err != nil {
		t.Fatal(err)
	}
	w.debounce = 20 * time.Millisecond
	rules, err := w.Load()
	if err != nil {
		t.Fatal(err)
	}
	if got := ruleMap(rules)["*"]; !cmp.Equal(got, []string{"100/1m"}) {
		t.Fatalf("initial rules: got %v, want [100/1m]", got)
	}
	ok, failed := w.reloads.WithLabelValues("ok"), w.reloads.WithLabelValues("error")

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	// Run's first look sees the content Load saw: nothing applied.
	time.Sleep(100 * time.Millisecond)
	if n := a.count(); n != 0 {
		t.Fatalf("applied %d times without a change, want 0", n)
	}

	// An edit in place is applied.
	write("default: [100/1m]\ntenants:\n  acme: [1000/1m]\n")
	eventually(t, "edit applied", func() bool { return a.count() == 1 })
	if got := ruleMap(a.last())["acme"]; !cmp.Equal(got, []string{"1000/1m"}) {
		t.Errorf("after edit: acme %v, want [1000/1m]", got)
	}
	eventually(t, "ok counted", func() bool { return counterValue(t, ok) == 1 })

	// An invalid edit keeps the rules and is counted.
	write("tenants:\n  acme: [oops]\n")
	eventually(t, "error counted", func() bool { return counterValue(t, failed) == 1 })
	if n := a.count(); n != 1 {
		t.Errorf("invalid file applied: %d applies, want 1", n)
	}

	// A replacement by rename is applied.
	replace("tenants:\n  \"weird tenant/with:chars\": [10/1s]\n")
	eventually(t, "rename applied", func() bool { return a.count() == 2 })
	if got := ruleMap(a.last())["weird tenant/with:chars"]; !cmp.Equal(got, []string{"10/1s"}) {
		t.Errorf("after rename: %v, want [10/1s]", got)
	}

	// Rules that apply refuses (e.g. not fitting the window kind) are kept out and counted.
	a.mu.Lock()
	a.fail = io.ErrUnexpectedEOF
	a.mu.Unlock()
	write("default: [1/1s]\n")
	eventually(t, "refused apply counted", func() bool { return counterValue(t, failed) == 2 })

	// The metric is registered under its name.
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, mf := range mfs {
		found = found || mf.GetName() == "gatekeeper_config_reloads_total"
	}
	if !found {
		t.Error("gatekeeper_config_reloads_total not registered")
	}
}

func TestWatcherDeletedFileKeepsRules(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "limits.yaml")
	if err := os.WriteFile(path, []byte("default: [5/1s]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var a applied
	w, err := NewWatcher(path, a.apply, testenv.DiscardLogger(), nil)
	if err != nil {
		t.Fatal(err)
	}
	w.debounce = 20 * time.Millisecond
	if _, err := w.Load(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go w.Run(ctx)
	time.Sleep(50 * time.Millisecond)

	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	failed := w.reloads.WithLabelValues("error")
	eventually(t, "removal counted", func() bool { return counterValue(t, failed) == 1 })
	if err := os.WriteFile(path, []byte("default: [6/1s]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	eventually(t, "new file applied", func() bool { return a.count() == 1 })
	if got := ruleMap(a.last())["*"]; !cmp.Equal(got, []string{"6/1s"}) {
		t.Errorf("got %v, want [6/1s]", got)
	}
}

// within runs f and fails the test if it has not returned after 10s (it
// would block forever on a FIFO without the regular-file check).
func within(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: still blocked after 10s", what)
	}
}

func TestReadLimitsFileRegularAndBounded(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	atMost := filepath.Join(dir, "at-most.yaml")
	if err := os.WriteFile(atMost, make([]byte, maxLimitsFile), 0o644); err != nil {
		t.Fatal(err)
	}
	over := filepath.Join(dir, "over.yaml")
	if err := os.WriteFile(over, make([]byte, maxLimitsFile+1), 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link.yaml") // ConfigMaps are symlinks
	if err := os.Symlink(atMost, link); err != nil {
		t.Fatal(err)
	}
	tests := []struct{ path, wantErr string }{
		{fifo, "a FIFO, not a regular file"},
		{dir, "a directory, not a regular file"},
		{"/dev/null", "a device, not a regular file"},
		{over, "larger than 1048576 bytes"},
		{atMost, ""},
		{link, ""},
	}
	for _, tt := range tests {
		t.Run(filepath.Base(tt.path), func(t *testing.T) {
			var err error
			within(t, "readLimitsFile", func() { _, err = readLimitsFile(tt.path) })
			if tt.wantErr == "" {
				if err != nil {
					t.Errorf("got %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("got %v, want an error containing %q", err, tt.wantErr)
			}
		})
	}
}

// TestConfigLimitsFileFIFO checks that start-up refuses a FIFO as
// LIMITS_FILE at once, naming the variable.
func TestConfigLimitsFileFIFO(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "limits.yaml")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	setEnv(t, with(minimal(), "LIMITS", "<unset>", "LIMITS_FILE", fifo))
	var err error
	within(t, "LoadConfig", func() { _, err = LoadConfig() })
	want := "GATEKEEPER_LIMITS_FILE: " + fifo + ": a FIFO, not a regular file"
	if err == nil || err.Error() != want {
		t.Errorf("got %v, want %s", err, want)
	}
}

// TestWatcherReloadRefusesFIFOAndQuotesNoContent replaces the watched file
// with a FIFO, then with a file that is not rules: each reload is refused,
// counted, keeps the rules, and logs no content of the file.
func TestWatcherReloadRefusesFIFOAndQuotesNoContent(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "limits.yaml")
	if err := os.WriteFile(path, []byte("default: [100/1m]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var a applied
	var logs bytes.Buffer
	w, err := NewWatcher(path, a.apply, slog.New(slog.NewJSONHandler(&logs, nil)), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Load(); err != nil {
		t.Fatal(err)
	}
	failed := w.reloads.WithLabelValues("error")

	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	within(t, "reload of a FIFO", w.reload)
	if got := counterValue(t, failed); got != 1 {
		t.Errorf("errors after the FIFO: got %v, want 1", got)
	}
	if !strings.Contains(logs.String(), "a FIFO, not a regular file") {
		t.Errorf("log %q does not say the file is a FIFO", logs.String())
	}

	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("root:x:0:0:root:/root:/bin/bash\nsecret: hunter2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	w.reload()
	if got := counterValue(t, failed); got != 2 {
		t.Errorf("errors after the password file: got %v, want 2", got)
	}
	if n := a.count(); n != 0 {
		t.Errorf("applied %d times, want 0", n)
	}
	for _, s := range []string{"root:x", "hunter2"} {
		if strings.Contains(logs.String(), s) {
			t.Errorf("log quotes %q from the file:\n%s", s, logs.String())
		}
	}
}
