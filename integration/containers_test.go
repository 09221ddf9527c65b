// The testcontainers-go path of the harness: used when no address is given in
// the environment and a Docker engine answers.
//
// testcontainers-go is at v0.40.0 because modules/kafka has no later release on
// the module proxy, and modules/kafka v0.40.0 does not compile against
// testcontainers-go v0.45.0.

package integration

import (
	"cmp"
	"context"
	"fmt"
	"net/url"
	"os"

	"github.com/testcontainers/testcontainers-go"
	tckafka "github.com/testcontainers/testcontainers-go/modules/kafka"
	tcredis "github.com/testcontainers/testcontainers-go/modules/redis"
)

// Images; confluent-local 7.9 is Apache Kafka 3.9 (the Kafka module needs a Confluent image).
var (
	kafkaImage = cmp.Or(os.Getenv("GATEKEEPER_TEST_KAFKA_IMAGE"), "confluentinc/confluent-local:7.9.0")
	redisImage = cmp.Or(os.Getenv("GATEKEEPER_TEST_REDIS_IMAGE"), "redis:7.0")
)

// runContainers starts the requested servers in Docker; errNoDocker when no engine answers.
func runContainers(ctx context.Context, needKafka, needRedis bool) (kafkaAddr, redisAddr string, stop func(), err error) {
	if !dockerHealthy(ctx) {
		return "", "", nil, errNoDocker
	}
	var ctrs []testcontainers.Container
	stop = func() {
		for i := len(ctrs) - 1; i >= 0; i-- {
			_ = testcontainers.TerminateContainer(ctrs[i])
		}
	}
	defer func() {
		if err != nil {
			stop()
		}
	}()
	if needKafka {
		kc, err := tckafka.Run(ctx, kafkaImage, testcontainers.WithEnv(map[string]string{
			"KAFKA_AUTO_CREATE_TOPICS_ENABLE": "false", // as deploy/local/kafka.sh
			"KAFKA_NUM_PARTITIONS":            "6",
			"KAFKA_MIN_INSYNC_REPLICAS":       "1",
		}))
		if kc != nil {
			ctrs = append(ctrs, kc)
		}
		if err != nil {
			return "", "", nil, fmt.Errorf("kafka container: %w", err)
		}
		brokers, err := kc.Brokers(ctx)
		if err != nil || len(brokers) == 0 {
			return "", "", nil, fmt.Errorf("kafka container brokers %v: %w", brokers, err)
		}
		kafkaAddr = brokers[0]
	}
	if needRedis {
		rc, err := tcredis.Run(ctx, redisImage)
		if rc != nil {
			ctrs = append(ctrs, rc)
		}
		if err != nil {
			return "", "", nil, fmt.Errorf("redis container: %w", err)
		}
		conn, err := rc.ConnectionString(ctx) // redis://host:port
		if err != nil {
			return "", "", nil, fmt.Errorf("redis container address: %w", err)
		}
		u, err := url.Parse(conn)
		if err != nil {
			return "", "", nil, fmt.Errorf("redis container address %q: %w", conn, err)
		}
		redisAddr = u.Host
	}
	return kafkaAddr, redisAddr, stop, nil
}

// dockerHealthy reports whether a Docker engine answers (testcontainers may panic without one).
func dockerHealthy(ctx context.Context) (ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	p, err := testcontainers.NewDockerProvider()
	if err != nil {
		return false
	}
	return p.Health(ctx) == nil // Health closes p
}
