package worker

import (
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/kelseyhightower/envconfig"
)

// usageVar reports whether `gatekeeper usage` reads the variable (its name
// without the prefix): every REDIS_ variable, the rules, and what the
// limiter's windows depend on.
func usageVar(variable string) bool {
	return strings.HasPrefix(variable, "REDIS_") ||
		slices.Contains([]string{"LIMITS", "LIMITS_FILE", "WINDOW", "TIMEZONE", "DEFER_HORIZON", "RETENTION"}, variable)
}

// LoadUsageConfig reads and validates only the variables that a usage
// query reads (see usageVar), so that `gatekeeper usage` runs where only
// Redis and the rules are configured. The other fields stay zero; the
// Config is fit for NewRedis, Rules and LimiterOptions, not for Serve.
// Its error is one line naming the variable.
func LoadUsageConfig() (*Config, error) {
	cfg, err := processVars(usageVar)
	if err != nil {
		return nil, err
	}
	cfg.setDefaults()
	if err := cfg.validate(usageVar); err != nil {
		return nil, err
	}
	return cfg, nil
}

// processVars reads from the environment the fields of Config whose
// variable keep accepts, with envconfig and Config's own tags (through a
// struct type of those fields alone), and leaves the others zero.
func processVars(keep func(variable string) bool) (*Config, error) {
	keys, err := ConfigKeys()
	if err != nil {
		return nil, err
	}
	typ := reflect.TypeFor[Config]()
	var fields []reflect.StructField
	var index []int // of fields in Config
	for i := range typ.NumField() {
		f := typ.Field(i)
		if !f.IsExported() {
			continue
		}
		if len(keys) == 0 {
			return nil, fmt.Errorf("config has more fields than envconfig sees")
		}
		key := keys[0]
		keys = keys[1:]
		if keep(strings.TrimPrefix(key, EnvPrefix+"_")) {
			f.Offset, f.Index = 0, nil
			fields = append(fields, f)
			index = append(index, i)
		}
	}
	sub := reflect.New(reflect.StructOf(fields))
	if err := envconfig.Process(EnvPrefix, sub.Interface()); err != nil {
		return nil, ProcessError(err)
	}
	var cfg Config
	v := reflect.ValueOf(&cfg).Elem()
	for k, i := range index {
		v.Field(i).Set(sub.Elem().Field(k))
	}
	return &cfg, nil
}
