package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
	"github.com/gatekeeper-dev/gatekeeper/internal/testenv"
	"github.com/gatekeeper-dev/gatekeeper/internal/worker"
)

// runMain runs realMain and returns its status, stdout and stderr.
func runMain(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := realMain(context.Background(), args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// setEnv makes the GATEKEEPER_* configuration exactly vars (names without
// the prefix): every other configuration variable is unset for the test,
// and so is every other GATEKEEPER_ variable that check-config would warn
// about (GATEKEEPER_LOCAL_DIR of the local servers, say), so that what the
// shell running the tests exports does not change their output.
func setEnv(t *testing.T, vars map[string]string) {
	t.Helper()
	keys, err := worker.ConfigKeys()
	if err != nil {
		t.Fatal(err)
	}
	unknown, err := worker.UnknownVars(os.Environ())
	if err != nil {
		t.Fatal(err)
	}
	testenv.SetEnv(t, worker.EnvPrefix, append(keys, unknown...), vars)
}

// minimal is the least configuration that validates; with adds to a copy.
var minimal, with = testenv.MinimalConfig, testenv.With

func TestMainSubcommands(t *testing.T) {
	setEnv(t, minimal())
	tests := []struct {
		args     []string
		wantCode int
		wantOut  string // substring of stdout
		wantErr  string // substring of stderr
	}{
		{[]string{"version"}, 0, "gatekeeper dev (" + runtime.Version(), ""},
		{[]string{"help"}, 0, "gatekeeper usage TENANT", ""},
		{[]string{"--help"}, 0, "GATEKEEPER_LIMITS", ""},
		{[]string{"bogus"}, 2, "", `unknown command "bogus"`},
		{[]string{"run", "extra"}, 2, "", "no arguments"},
		{[]string{"usage"}, 2, "", "one argument"},
		{[]string{"usage", "a", "b"}, 2, "", "one argument"},
		{[]string{"check-config", "x"}, 2, "", "no arguments"},
		{[]string{"config-table"}, 0, "| `GATEKEEPER_WINDOW` |", ""},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			code, out, errOut := runMain(t, tt.args...)
			if code != tt.wantCode || !strings.Contains(out, tt.wantOut) || !strings.Contains(errOut, tt.wantErr) {
				t.Errorf("got %d, stdout %q, stderr %q; want %d, stdout with %q, stderr with %q",
					code, out, errOut, tt.wantCode, tt.wantOut, tt.wantErr)
			}
		})
	}
	// The unknown-command text lists the commands on stderr.
	if _, _, errOut := runMain(t, "bogus"); !strings.Contains(errOut, "check-config") {
		t.Errorf("unknown command: stderr %q lacks the usage text", errOut)
	}
}

func TestMainBadConfig(t *testing.T) {
	// Every command that reads the configuration stops with one line naming
	// the variable, status 1, and nothing on stdout.
	for _, args := range [][]string{{}, {"run"}, {"check-config"}, {"usage", "acme"}} {
		t.Run(strings.Join(append([]string{"gatekeeper"}, args...), " "), func(t *testing.T) {
			setEnv(t, with(minimal(), "WINDOW", "hourly", "ADMIN_TOKEN", "s3cret-token-0123"))
			code, out, errOut := runMain(t, args...)
			if want := "GATEKEEPER_WINDOW: \"hourly\" is not aligned or ttl\n"; code != 1 || out != "" || errOut != want {
				t.Errorf("got %d, stdout %q, stderr %q; want 1, nothing, %q", code, out, errOut, want)
			}
		})
	}
}

func TestMainCheckConfig(t *testing.T) {
	setEnv(t, with(minimal(), "ADMIN_TOKEN", "s3cret-token-0123", "REDIS_PASSWORD", "pw", "REDIS_TLS", "true"))
	code, out, errOut := runMain(t, "check-config")
	if code != 0 {
		t.Fatalf("got %d, stderr %q; want 0", code, errOut)
	}
	for _, want := range []string{
		"GATEKEEPER_SOURCE_TOPICS=events\n",
		"GATEKEEPER_RETRY_TOPIC=events.out.retry\n",
		"GATEKEEPER_DLQ_TOPIC=events.out.dlq\n",
		"GATEKEEPER_ADMIN_TOKEN=****\n",
		"GATEKEEPER_REDIS_PASSWORD=****\n",
		"GATEKEEPER_KAFKA_SASL_PASSWORD=\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "s3cret") || strings.Contains(out, "=pw\n") {
		t.Errorf("stdout shows a secret:\n%s", out)
	}
	if errOut != "" {
		t.Errorf("stderr: got %q, want nothing (token set, Redis over TLS)", errOut)
	}
}

// TestMainCheckConfigWarnings checks that check-config accepts, with a
// warning line on stderr each, an open usage API and credentials without
// TLS, and refuses a short or placeholder token.
func TestMainCheckConfigWarnings(t *testing.T) {
	const token = "a-token-of-16-bytes-or-more"
	tests := []struct {
		name     string
		env      map[string]string
		wantCode int
		wantErr  string // stderr, exactly
	}{
		{"usage API open", minimal(), 0,
			"warning: GATEKEEPER_ADMIN_TOKEN is not set: the usage API is open to anyone who reaches :8080\n"},
		{"cleartext credentials", with(minimal(), "ADMIN_TOKEN", token, "REDIS_PASSWORD", "pw",
			"KAFKA_SASL_MECHANISM", "PLAIN", "KAFKA_SASL_USERNAME", "u", "KAFKA_SASL_PASSWORD", "p"), 0,
			"warning: GATEKEEPER_KAFKA_SASL_MECHANISM=PLAIN without GATEKEEPER_KAFKA_TLS: the SASL password and every event cross the network in cleartext\n" +
				"warning: GATEKEEPER_REDIS_PASSWORD without GATEKEEPER_REDIS_TLS: the password crosses the network in cleartext\n"},
		{"short token", with(minimal(), "ADMIN_TOKEN", "a"), 1,
			"GATEKEEPER_ADMIN_TOKEN: must be at least 16 bytes (e.g. openssl rand -base64 24)\n"},
		{"placeholder token", with(minimal(), "ADMIN_TOKEN", "REPLACE-ME-admin-token"), 1,
			"GATEKEEPER_ADMIN_TOKEN: is a REPLACE-ME... placeholder: set a random token (e.g. openssl rand -base64 24)\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			setEnv(t, tt.env)
			code, _, errOut := runMain(t, "check-config")
			if code != tt.wantCode || errOut != tt.wantErr {
				t.Errorf("got %d, stderr %q; want %d, %q", code, errOut, tt.wantCode, tt.wantErr)
			}
		})
	}
}

func TestMainConfigTable(t *testing.T) {
	want, err := worker.ConfigTable()
	if err != nil {
		t.Fatal(err)
	}
	_, out, _ := runMain(t, "config-table")
	if out != want {
		t.Errorf("config-table printed %q, want %q", out, want)
	}
	keys, _ := worker.ConfigKeys()
	rows := strings.Split(strings.TrimSpace(want), "\n")
	if len(rows) != len(keys)+2 {
		t.Errorf("got %d table rows, want header, rule and %d variables", len(rows), len(keys))
	}
	for _, row := range rows {
		if n := strings.Count(row, "|"); n != 6 {
			t.Errorf("row %q has %d pipes, want 6", row, n)
		}
	}
	table := want
	for _, row := range []string{
		"| `GATEKEEPER_SOURCE_TOPICS` | Comma-separated list of String | required |",
		"| `GATEKEEPER_RETRY_TOPIC` | String | `<DOWNSTREAM_TOPIC>.retry` |",
		"| `GATEKEEPER_LIMITS` | String | required unless LIMITS_FILE |",
		"| `GATEKEEPER_DEFER_HORIZON` | Duration | `24h` |",
		"| `GATEKEEPER_ADMIN_TOKEN` | String | none |",
	} {
		if !strings.Contains(table, row) {
			t.Errorf("table lacks %q", row)
		}
	}
}

// TestREADMEConfigTable keeps the README's configuration table equal to the
// one generated from Config (`gatekeeper config-table`).
func TestREADMEConfigTable(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if errors.Is(err, os.ErrNotExist) {
		t.Skip("no README.md yet")
	}
	if err != nil {
		t.Fatal(err)
	}
	diff, found, err := readmeTableDiff(readme)
	if err != nil {
		t.Fatal(err)
	}
	if !found {
		// An edit that loses a marker must not turn the check off.
		t.Fatalf("README.md has no %s ... %s section around its configuration table", tableBegin, tableEnd)
	}
	if diff != "" {
		t.Errorf("README.md configuration table is out of date; paste `go run ./cmd/gatekeeper config-table` between the markers (-generated +README):\n%s", diff)
	}
}

const tableBegin, tableEnd = "<!-- config-table -->", "<!-- /config-table -->"

// readmeTableDiff compares the README's config-table section with the
// generated table; found is false without the markers.
func readmeTableDiff(readme []byte) (diff string, found bool, err error) {
	_, rest, ok1 := strings.Cut(string(readme), tableBegin)
	section, _, ok2 := strings.Cut(rest, tableEnd)
	if !ok1 || !ok2 {
		return "", false, nil
	}
	want, err := worker.ConfigTable()
	if err != nil {
		return "", true, err
	}
	return cmp.Diff(strings.TrimSpace(want), strings.TrimSpace(section)), true, nil
}

func TestReadmeTableDiff(t *testing.T) {
	table, err := worker.ConfigTable()
	if err != nil {
		t.Fatal(err)
	}
	stale := strings.Replace(table, "`24h`", "`12h`", 1)
	tests := []struct {
		name      string
		readme    string
		wantFound bool
		wantDiff  bool
	}{
		{"no markers", "# Gatekeeper\n", false, false},
		{"only begin", "x " + tableBegin + "\n" + table, false, false},
		{"current", "# G\n\n" + tableBegin + "\n" + table + tableEnd + "\n\nmore", true, false},
		{"stale", tableBegin + "\n" + stale + tableEnd, true, true},
		{"empty section", tableBegin + tableEnd, true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			diff, found, err := readmeTableDiff([]byte(tt.readme))
			if err != nil {
				t.Fatal(err)
			}
			if found != tt.wantFound || (diff != "") != tt.wantDiff {
				t.Errorf("got found %v, diff %q; want found %v, diff %v", found, diff, tt.wantFound, tt.wantDiff)
			}
		})
	}
}

func TestMainUsage(t *testing.T) {
	rdb, addr := testenv.Redis(t)
	prefix := testenv.Prefix(t, rdb)
	const tenant = "weird tenant/with:chars"
	// Only Redis and the rules: usage reads nothing else, so the topics
	// need not be set, and a bad value elsewhere does not matter.
	env := map[string]string{"REDIS_ADDRS": addr, "REDIS_KEY_PREFIX": prefix,
		"LIMITS": "*=100/1m;acme=5/1m,50/1d", "TIMEZONE": "Europe/Berlin",
		"BATCH_SIZE": "lots", "KAFKA_BROKERS": "no-port"}
	setEnv(t, env)
	cfg, err := worker.LoadUsageConfig()
	if err != nil {
		t.Fatal(err)
	}
	rules, _ := cfg.Rules()
	opts, err := worker.LimiterOptions(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	lim, err := limit.New(ctx, rdb, rules, opts)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lim.Admit(ctx, []string{tenant, tenant, tenant, "acme", "acme"}); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		tenant string
		want   map[string][3]int64 // rule -> count, limit, remaining
	}{
		{tenant, map[string][3]int64{"100/1m": {3, 100, 97}}},
		{"acme", map[string][3]int64{"5/1m": {2, 5, 3}, "50/1d": {2, 50, 48}}},
		{"nobody", map[string][3]int64{"100/1m": {0, 100, 100}}},
	}
	for _, tt := range tests {
		t.Run(tt.tenant, func(t *testing.T) {
			code, out, errOut := runMain(t, "usage", tt.tenant)
			if code != 0 {
				t.Fatalf("got %d, stderr %q; want 0", code, errOut)
			}
			var got worker.UsageResponse
			if err := json.Unmarshal([]byte(out), &got); err != nil {
				t.Fatalf("stdout %q: %v", out, err)
			}
			if got.Tenant != tt.tenant {
				t.Errorf("got tenant %q, want %q", got.Tenant, tt.tenant)
			}
			gotRules := map[string][3]int64{}
			for _, u := range got.Rules {
				gotRules[u.Rule] = [3]int64{u.Count, u.Limit, u.Remaining}
				if !u.Reset.After(time.Now().Add(-time.Second)) {
					t.Errorf("rule %s: reset %v is in the past", u.Rule, u.Reset)
				}
			}
			if diff := cmp.Diff(tt.want, gotRules); diff != "" {
				t.Errorf("usage (-want +got):\n%s", diff)
			}
		})
	}
}

func TestMainUsageRedisDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens here now
	setEnv(t, with(minimal(), "REDIS_ADDRS", addr, "REDIS_TIMEOUT", "300ms"))
	code, out, errOut := runMain(t, "usage", "acme")
	if code != 1 || out != "" || strings.Count(errOut, "\n") != 1 {
		t.Errorf("got %d, stdout %q, stderr %q; want 1, nothing, one line", code, out, errOut)
	}
}
