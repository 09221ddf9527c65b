package worker

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"
)

// NewRedis returns the client of REDIS_ADDRS and REDIS_CLUSTER: a
// *redis.ClusterClient for a Redis Cluster, a *redis.Client for one Redis.
// Every call is bounded by REDIS_TIMEOUT.
//
// With REDIS_CLUSTER=auto (or empty), more than one address is a cluster
// and one address is asked with CLUSTER INFO: a reply means a cluster node,
// an error reply other than NOPERM (e.g. "cluster support disabled", or an
// unknown command) means one Redis. Only then does NewRedis call Redis, so
// only then can it fail; transientRedisError tells whether trying again
// may help (Redis unreachable or loading).
func NewRedis(ctx context.Context, cfg *Config) (redis.UniversalClient, error) {
	opts := redisOptions(cfg)
	switch {
	case cfg.RedisCluster == RedisClusterTrue,
		cfg.RedisCluster != RedisClusterFalse && len(cfg.RedisAddrs) > 1:
		return redis.NewClusterClient(opts.Cluster()), nil
	case cfg.RedisCluster == RedisClusterFalse:
		return redis.NewClient(opts.Simple()), nil
	}
	single := redis.NewClient(opts.Simple())
	cluster, err := isClusterNode(ctx, single)
	if err != nil || cluster {
		single.Close()
	}
	switch {
	case err != nil:
		return nil, err
	case cluster:
		return redis.NewClusterClient(opts.Cluster()), nil
	}
	return single, nil
}

func redisOptions(cfg *Config) *redis.UniversalOptions {
	tlsConfig := cfg.redisTLSConfig()
	t := cfg.RedisTimeout
	return &redis.UniversalOptions{
		Addrs:                 cfg.RedisAddrs,
		Username:              cfg.RedisUsername,
		Password:              cfg.RedisPassword,
		TLSConfig:             tlsConfig,
		DialTimeout:           t,
		ReadTimeout:           t,
		WriteTimeout:          t,
		PoolTimeout:           t,
		ContextTimeoutEnabled: true,
	}
}

// isClusterNode asks the server of rdb with CLUSTER INFO whether it is a
// Redis Cluster node. A server that answers with an error (other than
// NOPERM, or one that waiting may cure) is not: a cluster node always
// answers CLUSTER INFO. A refusal of the credentials also counts as not a
// cluster: the single-node client then fails with it where it is used.
func isClusterNode(ctx context.Context, rdb *redis.Client) (bool, error) {
	err := rdb.ClusterInfo(ctx).Err()
	var reply redis.Error
	switch {
	case err == nil:
		return true, nil
	case transientRedisError(err) || !errors.As(err, &reply):
		return false, fmt.Errorf("redis %s: %w", rdb.Options().Addr, err)
	case redis.HasErrorPrefix(err, "NOPERM"):
		return false, fmt.Errorf("%s_REDIS_CLUSTER=auto: cannot tell whether redis %s is a Redis Cluster node: CLUSTER INFO: %w; set %s_REDIS_CLUSTER to true or false",
			EnvPrefix, rdb.Options().Addr, err, EnvPrefix)
	}
	return false, nil // e.g. "ERR This instance has cluster support disabled"
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

// kafkaAuth returns the SASL mechanism and the TLS configuration that the
// Kafka dialer and transport share (either may be nil: not configured).
func kafkaAuth(cfg *Config) (sasl.Mechanism, *tls.Config, error) {
	mech, err := kafkaSASL(cfg)
	if err != nil {
		return nil, nil, err
	}
	tlsConfig, err := cfg.kafkaTLSConfig()
	if err != nil {
		return nil, nil, err
	}
	return mech, tlsConfig, nil
}

// NewKafkaDialer returns the dialer for consumer groups and readers, with
// the configured TLS, SASL and KAFKA_TIMEOUT.
func NewKafkaDialer(cfg *Config) (*kafka.Dialer, error) {
	mech, tlsConfig, err := kafkaAuth(cfg)
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
	mech, tlsConfig, err := kafkaAuth(cfg)
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
