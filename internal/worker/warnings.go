package worker

import "fmt"

// Warnings lists, one line each, what a valid configuration leaves open:
// a usage API without a token, and credentials sent without TLS. `run`
// logs them at start and `check-config` prints them; neither refuses them,
// as a trusted network may make them harmless.
func (c *Config) Warnings() []string {
	var out []string
	if c.AdminToken == "" && c.AdminTokens == "" {
		out = append(out, fmt.Sprintf("%s_ADMIN_TOKEN is not set: the usage API is open to anyone who reaches %s", EnvPrefix, c.HTTPAddr))
	}
	if c.KafkaSASLMechanism != "" && !c.KafkaTLS {
		what := "the SASL exchange and every event cross the network unencrypted"
		if c.KafkaSASLMechanism == "PLAIN" {
			what = "the SASL password and every event cross the network in cleartext"
		}
		out = append(out, fmt.Sprintf("%s_KAFKA_SASL_MECHANISM=%s without %s_KAFKA_TLS: %s", EnvPrefix, c.KafkaSASLMechanism, EnvPrefix, what))
	}
	if c.RedisPassword != "" && !c.RedisTLS {
		out = append(out, fmt.Sprintf("%s_REDIS_PASSWORD without %s_REDIS_TLS: the password crosses the network in cleartext", EnvPrefix, EnvPrefix))
	}
	return out
}
