package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"
)

// NewRedis returns a client of REDIS_ADDRS: a *redis.Client for one address,
// a *redis.ClusterClient for more. Every call is bounded by REDIS_TIMEOUT.
func NewRedis(cfg *Config) redis.UniversalClient {
	tlsConfig := cfg.redisTLSConfig()
	t := cfg.RedisTimeout
	// With MasterName unset, NewUniversalClient returns a cluster client for
	// more than one address and a single-node client for one.
	return redis.NewUniversalClient(&redis.UniversalOptions{
		Addrs:                 cfg.RedisAddrs,
		Username:              cfg.RedisUsername,
		Password:              cfg.RedisPassword,
		TLSConfig:             tlsConfig,
		DialTimeout:           t,
		ReadTimeout:           t,
		WriteTimeout:          t,
		PoolTimeout:           t,
		ContextTimeoutEnabled: true,
	})
}

// redisCheck is the readiness check of Redis: a PING (on every master, for
// a cluster).
func redisCheck(rdb redis.UniversalClient) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		if c, ok := rdb.(*redis.ClusterClient); ok {
			return c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
				return n.Ping(ctx).Err()
			})
		}
		return rdb.Ping(ctx).Err()
	}
}

// kafkaSASL returns the SASL mechanism of the configuration, or nil.
func kafkaSASL(cfg *Config) (sasl.Mechanism, error) {
	switch cfg.KafkaSASLMechanism {
	case "":
		return nil, nil
	case "PLAIN":
		return plain.Mechanism{Username: cfg.KafkaSASLUsername, Password: cfg.KafkaSASLPassword}, nil
	case "SCRAM-SHA-256":
		return scram.Mechanism(scram.SHA256, cfg.KafkaSASLUsername, cfg.KafkaSASLPassword)
	case "SCRAM-SHA-512":
		return scram.Mechanism(scram.SHA512, cfg.KafkaSASLUsername, cfg.KafkaSASLPassword)
	}
	return nil, fmt.Errorf("kafka sasl mechanism %q: want PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512", cfg.KafkaSASLMechanism)
}

// NewKafkaDialer returns the dialer for consumer groups and readers, with
// the configured TLS, SASL and KAFKA_TIMEOUT.
func NewKafkaDialer(cfg *Config) (*kafka.Dialer, error) {
	mech, err := kafkaSASL(cfg)
	if err != nil {
		return nil, err
	}
	tlsConfig, err := cfg.kafkaTLSConfig()
	if err != nil {
		return nil, err
	}
	return &kafka.Dialer{
		ClientID:      "gatekeeper",
		Timeout:       cfg.KafkaTimeout,
		DualStack:     true,
		TLS:           tlsConfig,
		SASLMechanism: mech,
	}, nil
}

// NewKafkaTransport returns the transport for writers, with the configured
// TLS, SASL and KAFKA_TIMEOUT.
func NewKafkaTransport(cfg *Config) (*kafka.Transport, error) {
	mech, err := kafkaSASL(cfg)
	if err != nil {
		return nil, err
	}
	tlsConfig, err := cfg.kafkaTLSConfig()
	if err != nil {
		return nil, err
	}
	return &kafka.Transport{
		ClientID:    "gatekeeper",
		DialTimeout: cfg.KafkaTimeout,
		IdleTimeout: 30 * time.Second,
		MetadataTTL: 15 * time.Second,
		TLS:         tlsConfig,
		SASL:        mech,
	}, nil
}

// kafkaCheck is the readiness check of Kafka: some bootstrap broker answers
// a metadata request.
func kafkaCheck(d *kafka.Dialer, brokers []string) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		var errs []error
		for _, b := range brokers {
			conn, err := d.DialContext(ctx, "tcp", b)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if dl, ok := ctx.Deadline(); ok {
				_ = conn.SetDeadline(dl)
			}
			_, err = conn.Brokers()
			conn.Close()
			if err == nil {
				return nil
			}
			errs = append(errs, fmt.Errorf("%s: %w", b, err))
			if ctx.Err() != nil {
				break
			}
		}
		return fmt.Errorf("no broker of %v answers: %w", brokers, errors.Join(errs...))
	}
}
