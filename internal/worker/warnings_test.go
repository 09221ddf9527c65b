package worker

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestConfigWarnings(t *testing.T) {
	const token = "a-token-of-16-bytes-or-more"
	secure := Config{HTTPConfig: HTTPConfig{HTTPAddr: ":8080", AdminToken: token}}
	tests := []struct {
		name string
		cfg  Config
		want []string
	}{
		{"token set", secure, nil},
		{"usage API open", Config{HTTPConfig: HTTPConfig{HTTPAddr: ":9090"}}, []string{
			"GATEKEEPER_ADMIN_TOKEN is not set: the usage API is open to anyone who reaches :9090",
		}},
		{"sasl plain without tls", Config{HTTPConfig: HTTPConfig{AdminToken: token}, KafkaConfig: KafkaConfig{KafkaSASLMechanism: "PLAIN"}}, []string{
			"GATEKEEPER_KAFKA_SASL_MECHANISM=PLAIN without GATEKEEPER_KAFKA_TLS: the SASL password and every event cross the network in cleartext",
		}},
		{"sasl scram without tls", Config{HTTPConfig: HTTPConfig{AdminToken: token}, KafkaConfig: KafkaConfig{KafkaSASLMechanism: "SCRAM-SHA-512"}}, []string{
			"GATEKEEPER_KAFKA_SASL_MECHANISM=SCRAM-SHA-512 without GATEKEEPER_KAFKA_TLS: the SASL exchange and every event cross the network unencrypted",
		}},
		{"sasl with tls", Config{HTTPConfig: HTTPConfig{AdminToken: token}, KafkaConfig: KafkaConfig{KafkaSASLMechanism: "SCRAM-SHA-256", KafkaTLS: true}}, nil},
		{"tls without sasl", Config{HTTPConfig: HTTPConfig{AdminToken: token}, KafkaConfig: KafkaConfig{KafkaTLS: true}}, nil},
		{"redis password without tls", Config{HTTPConfig: HTTPConfig{AdminToken: token}, RedisConfig: RedisConfig{RedisPassword: "pw"}}, []string{
			"GATEKEEPER_REDIS_PASSWORD without GATEKEEPER_REDIS_TLS: the password crosses the network in cleartext",
		}},
		{"redis password with tls", Config{HTTPConfig: HTTPConfig{AdminToken: token}, RedisConfig: RedisConfig{RedisPassword: "pw", RedisTLS: true}}, nil},
		{"redis user without password", Config{HTTPConfig: HTTPConfig{AdminToken: token}, RedisConfig: RedisConfig{RedisUsername: "gk"}}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, tt.cfg.Warnings()); diff != "" {
				t.Errorf("warnings (-want +got):\n%s", diff)
			}
		})
	}
}
