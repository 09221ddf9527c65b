package worker

import (
	"slices"
	"strings"

	"github.com/kelseyhightower/envconfig"
)

// usageVar reports whether `gatekeeper usage` reads the variable (its name
// without the prefix): every REDIS_ variable, the rules, and what the
// limiter's windows depend on; the variables of RedisConfig and
// LimitsConfig (a test holds them in step).
func usageVar(variable string) bool {
	return strings.HasPrefix(variable, "REDIS_") ||
		slices.Contains([]string{"LIMITS", "LIMITS_FILE", "CAPACITY", "WINDOW", "TIMEZONE", "DEFER_HORIZON", "RETENTION"}, variable)
}

// LoadUsageConfig reads and validates only the variables that a usage
// query reads: the Redis and Limits groups (see usageVar), so that
// `gatekeeper usage` runs where only Redis and the rules are configured.
// The other fields stay zero; the Config is fit for NewRedis, Rules and
// LimiterOptions, not for Serve. Its error is one line naming the variable.
func LoadUsageConfig() (*Config, error) {
	var cfg Config
	for _, group := range []any{&cfg.RedisConfig, &cfg.LimitsConfig} {
		if err := envconfig.Process(EnvPrefix, group); err != nil {
			return nil, ProcessError(err)
		}
	}
	cfg.setDefaults()
	if err := cfg.validate(usageVar); err != nil {
		return nil, err
	}
	return &cfg, nil
}
