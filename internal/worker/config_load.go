package worker

import (
	"errors"
	"fmt"
	"strings"

	"github.com/kelseyhightower/envconfig"
)

// LoadConfig reads the environment, fills derived defaults and validates.
// Its error is one line naming the variable.
func LoadConfig() (*Config, error) {
	var cfg Config
	if err := envconfig.Process(EnvPrefix, &cfg); err != nil {
		return nil, ProcessError(err)
	}
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &cfg, nil
}

// ProcessError turns envconfig's errors into one line naming the variable.
func ProcessError(err error) error {
	var pe *envconfig.ParseError
	if errors.As(err, &pe) {
		what := pe.TypeName
		switch pe.TypeName {
		case "time.Duration":
			what = "a duration (e.g. 50ms, 2s, 24h)"
		case "bool":
			what = "true or false"
		case "int", "int64":
			what = "a whole number"
		}
		return &configError{Var: strings.TrimPrefix(pe.KeyName, EnvPrefix+"_"), Msg: fmt.Sprintf("%q is not %s", pe.Value, what)}
	}
	// envconfig: "required key GATEKEEPER_X missing value".
	if msg := err.Error(); strings.HasPrefix(msg, "required key ") && strings.HasSuffix(msg, " missing value") {
		key := strings.TrimSuffix(strings.TrimPrefix(msg, "required key "), " missing value")
		return &configError{Var: strings.TrimPrefix(key, EnvPrefix+"_"), Msg: "required, not set"}
	}
	return fmt.Errorf("read %s_* environment: %s", EnvPrefix, OneLine(err.Error()))
}

// setDefaults fills the defaults that depend on other variables and trims
// list items.
func (c *Config) setDefaults() {
	for _, l := range []*[]string{&c.KafkaBrokers, &c.SourceTopics, &c.RedisAddrs, &c.Roles} {
		for i := range *l {
			(*l)[i] = strings.TrimSpace((*l)[i])
		}
	}
	c.DownstreamTopic = strings.TrimSpace(c.DownstreamTopic)
	if c.RetryTopic == "" && c.DownstreamTopic != "" {
		c.RetryTopic = c.DownstreamTopic + ".retry"
	}
	if c.DLQTopic == "" && c.DownstreamTopic != "" {
		c.DLQTopic = c.DownstreamTopic + ".dlq"
	}
}
