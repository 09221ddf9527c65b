// Command producer is the sample load of deploy/compose: it writes events for
// a weighted mix of tenants to a Kafka topic at a steady rate, keyed by tenant
// (Gatekeeper's default GATEKEEPER_TENANT_FROM=key), until it is stopped or
// has written PRODUCER_COUNT events.
//
// Environment:
//
//	PRODUCER_BROKERS  comma-separated bootstrap brokers     (default localhost:9092)
//	PRODUCER_TOPIC    topic to write to                     (default events)
//	PRODUCER_RATE     events per second                     (default 20)
//	PRODUCER_TENANTS  tenant[:weight],... picked at random  (default acme:5,globex:3,initech:1,trial:1)
//	PRODUCER_COUNT    stop after this many events, 0 never  (default 0)
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/segmentio/kafka-go"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := realMain(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "producer:", err)
		os.Exit(1)
	}
}

// config is the producer's environment.
type config struct {
	Brokers []string
	Topic   string
	Rate    float64
	Tenants []weighted
	Count   int
}

// weighted is a tenant and its share of the events.
type weighted struct {
	Tenant string
	Weight int
}

func env(k, def string) string {
	if v := strings.TrimSpace(os.Getenv(k)); v != "" {
		return v
	}
	return def
}

func loadConfig() (config, error) {
	c := config{
		Brokers: strings.Split(env("PRODUCER_BROKERS", "localhost:9092"), ","),
		Topic:   env("PRODUCER_TOPIC", "events"),
	}
	var err error
	if c.Rate, err = strconv.ParseFloat(env("PRODUCER_RATE", "20"), 64); err != nil || c.Rate <= 0 {
		return c, fmt.Errorf("PRODUCER_RATE %q: want a positive number", os.Getenv("PRODUCER_RATE"))
	}
	if c.Count, err = strconv.Atoi(env("PRODUCER_COUNT", "0")); err != nil || c.Count < 0 {
		return c, fmt.Errorf("PRODUCER_COUNT %q: want a whole number, 0 for no end", os.Getenv("PRODUCER_COUNT"))
	}
	if c.Tenants, err = parseTenants(env("PRODUCER_TENANTS", "acme:5,globex:3,initech:1,trial:1")); err != nil {
		return c, fmt.Errorf("PRODUCER_TENANTS: %w", err)
	}
	return c, nil
}

// parseTenants parses "acme:5,globex,trial:2" (weight 1 when left out).
func parseTenants(spec string) ([]weighted, error) {
	var out []weighted
	for _, item := range strings.Split(spec, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, w, found := strings.Cut(item, ":")
		weight := 1
		if found {
			n, err := strconv.Atoi(w)
			if err != nil || n < 1 {
				return nil, fmt.Errorf("%q: weight must be a whole number of at least 1", item)
			}
			weight = n
		}
		if name == "" {
			return nil, fmt.Errorf("%q: empty tenant", item)
		}
		out = append(out, weighted{Tenant: name, Weight: weight})
	}
	if len(out) == 0 {
		return nil, errors.New("no tenants")
	}
	return out, nil
}

// pick returns the tenant that r (0 <= r < total weight) falls on.
func pick(ts []weighted, r int) string {
	for _, t := range ts {
		if r < t.Weight {
			return t.Tenant
		}
		r -= t.Weight
	}
	return ts[len(ts)-1].Tenant
}

func realMain(ctx context.Context) error {
	cfg, err := loadConfig()
	if err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	w := &kafka.Writer{
		Addr:         kafka.TCP(cfg.Brokers...),
		Topic:        cfg.Topic,
		Balancer:     &kafka.Hash{},
		RequiredAcks: kafka.RequireAll,
		BatchTimeout: 5 * time.Millisecond,
		WriteTimeout: 10 * time.Second,
	}
	defer w.Close()
	total := 0
	for _, t := range cfg.Tenants {
		total += t.Weight
	}
	tick := time.NewTicker(time.Duration(float64(time.Second) / cfg.Rate))
	defer tick.Stop()
	report := time.NewTicker(10 * time.Second)
	defer report.Stop()
	log.Info("producing", slog.String("topic", cfg.Topic), slog.Float64("rate", cfg.Rate), slog.Int("count", cfg.Count))
	for seq := 1; cfg.Count == 0 || seq <= cfg.Count; {
		select {
		case <-ctx.Done():
			log.Info("stopped", slog.Int("written", seq-1))
			return nil
		case <-report.C:
			log.Info("progress", slog.Int("written", seq-1))
			continue
		case <-tick.C:
		}
		tenant := pick(cfg.Tenants, rand.IntN(total))
		value, _ := json.Marshal(map[string]any{"tenant": tenant, "seq": seq, "at": time.Now().UTC().Format(time.RFC3339Nano)})
		if err := w.WriteMessages(ctx, kafka.Message{Key: []byte(tenant), Value: value}); err != nil {
			if ctx.Err() != nil {
				continue
			}
			// The topic may not exist yet, or the broker may be restarting.
			log.Warn("write failed, retrying", slog.String("err", err.Error()))
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		seq++
	}
	log.Info("done", slog.Int("written", cfg.Count))
	return nil
}
