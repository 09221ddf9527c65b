package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
)

// lines decodes JSON log lines.
func lines(t *testing.T, buf *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line %q is not JSON: %v", l, err)
		}
		out = append(out, m)
	}
	return out
}

func TestNewLoggerLevels(t *testing.T) {
	tests := []struct {
		level string
		want  []string // messages that get through, of debug, info, warn, error
	}{
		{"debug", []string{"d", "i", "w", "e"}},
		{"info", []string{"i", "w", "e"}},
		{"warn", []string{"w", "e"}},
		{"error", []string{"e"}},
	}
	for _, tt := range tests {
		t.Run(tt.level, func(t *testing.T) {
			var buf bytes.Buffer
			log, err := NewLogger(&buf, tt.level)
			if err != nil {
				t.Fatal(err)
			}
			log.Debug("d")
			log.Info("i")
			log.Warn("w")
			log.Error("e")
			var got []string
			for _, l := range lines(t, &buf) {
				got = append(got, l["msg"].(string))
			}
			if strings.Join(got, ",") != strings.Join(tt.want, ",") {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
	if _, err := NewLogger(&bytes.Buffer{}, "loud"); err == nil {
		t.Error("level loud: got no error")
	}
}

func TestLoggerJSONAndSecrets(t *testing.T) {
	var buf bytes.Buffer
	log, err := NewLogger(&buf, "info")
	if err != nil {
		t.Fatal(err)
	}
	log.Info("hello", slog.String("tenant", "acme"), slog.String("password", "pw1"), slog.String("admin_token", "tok1"),
		slog.Group("redis", slog.String("password", "pw2")))
	got := lines(t, &buf)
	if len(got) != 1 {
		t.Fatalf("got %d lines, want 1", len(got))
	}
	if got[0]["tenant"] != "acme" || got[0]["level"] != "INFO" || got[0]["time"] == nil {
		t.Errorf("got %v, want tenant, level and time", got[0])
	}
	for _, secret := range []string{"pw1", "pw2", "tok1"} {
		if strings.Contains(buf.String(), secret) {
			t.Errorf("log shows secret %q: %s", secret, buf.String())
		}
	}
}

func TestRedisLogger(t *testing.T) {
	var buf bytes.Buffer
	log, _ := NewLogger(&buf, "info")
	redisLogger{log: log}.Printf(context.Background(), "redis: connection pool: %s", "failed to dial")
	got := lines(t, &buf)
	if len(got) != 1 || got[0]["level"] != "WARN" || got[0]["component"] != "redis" {
		t.Errorf("got %v, want one warn line with component redis", got)
	}
}
