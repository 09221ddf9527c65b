package worker

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
	"github.com/gatekeeper-dev/gatekeeper/internal/testenv"
)

func TestStartLimiterWaitsForRedis(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	rdb := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: 100 * time.Millisecond})
	defer rdb.Close()
	rules, err := limit.ParseRules("*=1/1s")
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	log, _ := NewLogger(&logs, "info")
	ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
	defer cancel()
	// Each attempt registers the limiter's metrics anew: must not panic.
	reg := prometheus.NewRegistry()
	lim, err := startLimiter(ctx, log, rdb, rules, limit.Options{Timeout: 100 * time.Millisecond, Registerer: reg})
	if lim != nil || err != nil {
		t.Errorf("got %v, %v; want nil, nil once ctx is done", lim, err)
	}
	if n := strings.Count(logs.String(), "redis unavailable"); n < 2 {
		t.Errorf("got %d retries logged, want at least 2:\n%s", n, logs.String())
	}
}

func TestStartLimiterStartsWithRedis(t *testing.T) {
	rdb, _ := testenv.Redis(t)
	rules, _ := limit.ParseRules("*=1/1s")
	reg := prometheus.NewRegistry()
	lim, err := startLimiter(context.Background(), testenv.DiscardLogger(), rdb, rules, limit.Options{Prefix: testenv.Prefix(t, rdb), Registerer: reg})
	if lim == nil || err != nil {
		t.Fatalf("got %v, %v; want a limiter", lim, err)
	}
	if _, err := lim.Admit(context.Background(), []string{"a"}); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(mfs) == 0 {
		t.Error("limiter metrics not registered")
	}
}

func TestTransientRedisError(t *testing.T) {
	tests := []struct {
		err  error
		want bool
	}{
		{&net.OpError{Op: "dial", Err: errors.New("connection refused")}, true},
		{io.EOF, true},
		{context.DeadlineExceeded, true},
		{redis.ErrPoolTimeout, true},
		{redis.ErrClosed, false},
		{errors.New("WRONGPASS invalid username-password pair"), false},
		{errors.New("ERR Error compiling script"), false},
	}
	for _, tt := range tests {
		if got := transientRedisError(tt.err); got != tt.want {
			t.Errorf("%v: got %v, want %v", tt.err, got, tt.want)
		}
	}
}

func TestKafkaSASL(t *testing.T) {
	tests := []struct {
		mech, want string
	}{
		{"", ""},
		{"PLAIN", "PLAIN"},
		{"SCRAM-SHA-256", "SCRAM-SHA-256"},
		{"SCRAM-SHA-512", "SCRAM-SHA-512"},
	}
	for _, tt := range tests {
		cfg := &Config{KafkaConfig: KafkaConfig{KafkaSASLMechanism: tt.mech, KafkaSASLUsername: "u", KafkaSASLPassword: "p", KafkaTimeout: time.Second}}
		d, err := NewKafkaDialer(cfg)
		if err != nil {
			t.Fatalf("%s: %v", tt.mech, err)
		}
		got := ""
		if d.SASLMechanism != nil {
			got = d.SASLMechanism.Name()
		}
		if got != tt.want {
			t.Errorf("got mechanism %q, want %q", got, tt.want)
		}
	}
	if _, err := NewKafkaTransport(&Config{KafkaConfig: KafkaConfig{KafkaSASLMechanism: "GSSAPI"}}); err == nil {
		t.Error("GSSAPI: got no error")
	}
}
