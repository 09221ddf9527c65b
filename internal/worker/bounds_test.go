package worker

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestSettingRangesCoverConfig checks that every count and duration
// variable has a range, of its type, holding its default.
func TestSettingRangesCoverConfig(t *testing.T) {
	var c Config
	fields, err := configFields(&c)
	if err != nil {
		t.Fatal(err)
	}
	ranged := map[string]settingRange{}
	for _, r := range settingRanges {
		if _, dup := ranged[r.key]; dup {
			t.Errorf("%s has two ranges", r.key)
		}
		ranged[r.key] = r
		f, ok := fields[r.key]
		if !ok {
			t.Errorf("range of %s, which is not a variable", r.key)
			continue
		}
		if isDuration := f.Type() == reflect.TypeOf(time.Duration(0)); isDuration != r.duration {
			t.Errorf("%s: range says duration %v, field is %v", r.key, r.duration, f.Type())
		}
		if r.min < 1 || r.min > r.max {
			t.Errorf("%s: range %d to %d, want 1 <= min <= max", r.key, r.min, r.max)
		}
	}
	for key, f := range fields {
		switch f.Kind() {
		case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
			reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Float32, reflect.Float64:
			if _, ok := ranged[key]; !ok {
				t.Errorf("%s (%v) has no range in settingRanges", key, f.Type())
			}
		}
	}
	// The defaults are in range: the minimal configuration validates.
	setEnv(t, minimal())
	if _, err := LoadConfig(); err != nil {
		t.Errorf("defaults: got %v, want no error", err)
	}
}

// TestConfigRanges checks each range's ends and the values just outside,
// among them the values of issue 14 that were accepted and broke `run`.
func TestConfigRanges(t *testing.T) {
	tests := []struct {
		key, value string
		want       string // "" when accepted
	}{
		{"DEFER_HORIZON", "1s", ""},
		{"DEFER_HORIZON", "744h", ""},
		{"DEFER_HORIZON", "1ns", "GATEKEEPER_DEFER_HORIZON: 1ns is not from 1s to 744h"},
		{"DEFER_HORIZON", "745h", "GATEKEEPER_DEFER_HORIZON: 745h is not from 1s to 744h"},
		{"DEFER_HORIZON", "100000h", "GATEKEEPER_DEFER_HORIZON: 100000h is not from 1s to 744h"},
		{"DEFER_HORIZON", "2562047h", "GATEKEEPER_DEFER_HORIZON: 2562047h is not from 1s to 744h"},
		{"MAX_ATTEMPTS", "1000", ""},
		{"MAX_ATTEMPTS", "9999999999999", "GATEKEEPER_MAX_ATTEMPTS: 9999999999999 is not from 1 to 1000"},
		{"MAX_ATTEMPTS", "0", "GATEKEEPER_MAX_ATTEMPTS: 0 is not from 1 to 1000"},
		{"BATCH_SIZE", "100000", ""},
		{"BATCH_SIZE", "100001", "GATEKEEPER_BATCH_SIZE: 100001 is not from 1 to 100000"},
		{"RETRY_LOOKAHEAD", "100000", ""},
		{"RETRY_LOOKAHEAD", "1000000", "GATEKEEPER_RETRY_LOOKAHEAD: 1000000 is not from 1 to 100000"},
		{"BATCH_BYTES", "1023", "GATEKEEPER_BATCH_BYTES: 1023 is not from 1024 (1 KiB) to 1073741824 (1 GiB)"},
		{"RETRY_LOOKAHEAD_BYTES", "1073741825", "GATEKEEPER_RETRY_LOOKAHEAD_BYTES: 1073741825 is not from 1024 (1 KiB) to 1073741824 (1 GiB)"},
		{"MAX_MESSAGE_BYTES", "104857600", ""},
		{"MAX_MESSAGE_BYTES", "104857601", "GATEKEEPER_MAX_MESSAGE_BYTES: 104857601 is not from 1024 (1 KiB) to 104857600 (100 MiB)"},
		{"BATCH_WAIT", "1ms", ""},
		{"BATCH_WAIT", "1ns", "GATEKEEPER_BATCH_WAIT: 1ns is not from 1ms to 10s"},
		{"BATCH_WAIT", "1000h", "GATEKEEPER_BATCH_WAIT: 1000h is not from 1ms to 10s"},
		{"SHUTDOWN_GRACE", "10m", ""},
		{"SHUTDOWN_GRACE", "999ms", "GATEKEEPER_SHUTDOWN_GRACE: 999ms is not from 1s to 10m"},
		{"REDIS_TIMEOUT", "10ms", ""},
		{"REDIS_TIMEOUT", "1ns", "GATEKEEPER_REDIS_TIMEOUT: 1ns is not from 10ms to 1m"},
		{"REDIS_TIMEOUT", "1h", "GATEKEEPER_REDIS_TIMEOUT: 1h is not from 10ms to 1m"},
		{"KAFKA_TIMEOUT", "5m", ""},
		{"KAFKA_TIMEOUT", "1ns", "GATEKEEPER_KAFKA_TIMEOUT: 1ns is not from 1s to 5m"},
		{"KAFKA_SESSION_TIMEOUT", "5m1s", "GATEKEEPER_KAFKA_SESSION_TIMEOUT: 5m1s is not from 1s to 5m"},
		{"RETENTION", "1m", ""},
		{"RETENTION", "8784h", ""},
		{"RETENTION", "1ns", "GATEKEEPER_RETENTION: 1ns is not from 1m to 8784h"},
		{"RETENTION", "8785h", "GATEKEEPER_RETENTION: 8785h is not from 1m to 8784h"},
	}
	for _, tt := range tests {
		t.Run(tt.key+"="+tt.value, func(t *testing.T) {
			setEnv(t, with(minimal(), tt.key, tt.value))
			_, err := LoadConfig()
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("got %v, want no error", err)
			case tt.want != "" && (err == nil || err.Error() != tt.want):
				t.Errorf("got %v, want %s", err, tt.want)
			}
		})
	}
}

// TestConfigLimitsBounds checks that LIMITS and LIMITS_FILE refuse windows
// over a year and bad tenant names with one line naming the variable (and
// the file) and the rule or tenant, escaped.
func TestConfigLimitsBounds(t *testing.T) {
	file := writeFile(t, "limits.yaml", "tenants:\n  \"a\\eb\": [1/1m]\n")
	long := writeFile(t, "long.yaml", "default: [10/106752d]\n")
	tests := []struct {
		env  map[string]string
		want string
	}{
		{with(minimal(), "LIMITS", "*=10/213504d"), `GATEKEEPER_LIMITS: "*=10/213504d": rule "10/213504d": window longer than a year (at most 366d; the longest windows are 366d, 52w, 12mo)`},
		{with(minimal(), "WINDOW", "ttl", "LIMITS", "a=10/106752d"), `GATEKEEPER_LIMITS: "a=10/106752d": rule "10/106752d": window longer than a year (at most 366d; the longest windows are 366d, 52w, 12mo)`},
		{with(minimal(), "LIMITS", "a=b=10/1m"), `GATEKEEPER_LIMITS: "a=b=10/1m": tenant "a=b": must not hold "="`},
		{with(minimal(), "LIMITS", "a\x1b[31m\x07=10/1m"), `GATEKEEPER_LIMITS: "a\x1b[31m\a=10/1m": tenant "a\x1b[31m\a": must not hold control characters`},
		{with(minimal(), "LIMITS", "<unset>", "LIMITS_FILE", file), `GATEKEEPER_LIMITS_FILE: ` + file + `: tenant "a\x1bb": must not hold control characters`},
		{with(minimal(), "WINDOW", "ttl", "LIMITS", "<unset>", "LIMITS_FILE", long), `GATEKEEPER_LIMITS_FILE: ` + long + `: default: rule "10/106752d": window longer than a year (at most 366d; the longest windows are 366d, 52w, 12mo)`},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			setEnv(t, tt.env)
			_, err := LoadConfig()
			if err == nil || err.Error() != tt.want {
				t.Errorf("got %v, want %s", err, tt.want)
			}
		})
	}
}

// TestConfigTableBounds checks that the configuration table shows the
// bounds Validate checks.
func TestConfigTableBounds(t *testing.T) {
	table, err := ConfigTable()
	if err != nil {
		t.Fatal(err)
	}
	for _, row := range []string{
		"| Variable | Type | Default | Bounds | Description |",
		"| `GATEKEEPER_DEFER_HORIZON` | Duration | `24h` | 1s to 744h |",
		"| `GATEKEEPER_REDIS_TIMEOUT` | Duration | `2s` | 10ms to 1m |",
		"| `GATEKEEPER_MAX_MESSAGE_BYTES` | Integer | `1048576` | 1024 (1 KiB) to 104857600 (100 MiB) |",
		"| `GATEKEEPER_LIMITS` | String | required unless LIMITS_FILE | limits 0 to 2^40 (bytes: 0B to 2^50, 1PiB); windows 1s to 366d (52w, 12mo); tenants 1 to 256 bytes, without = or control characters |",
		"| `GATEKEEPER_COST_FROM` | String | none | a cost is a whole number 0 to 2^40 in plain decimal; header names not starting with gk- |",
		"| `GATEKEEPER_LIMITS_FILE` | String | none | a regular file of at most 1048576 (1 MiB) bytes, one YAML document; rules as in LIMITS |",
	} {
		if !strings.Contains(table, row) {
			t.Errorf("table lacks %q", row)
		}
	}
	for _, r := range settingRanges {
		row := "| `" + EnvPrefix + "_" + r.key + "` |"
		want := " | " + r.format(r.min) + " to " + r.format(r.max) + " | "
		for _, line := range strings.Split(table, "\n") {
			if strings.HasPrefix(line, row) && !strings.Contains(line, want) {
				t.Errorf("row %q lacks %q", line, want)
			}
		}
	}
	if strings.Contains(table, boundsMark) {
		t.Error("table holds a bounds placeholder")
	}
}

// writeFile writes content to a new file named name in a temporary
// directory and returns its path.
func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}
