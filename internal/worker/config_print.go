package worker

import (
	"bytes"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/kelseyhightower/envconfig"
)

// mask replaces a secret when the configuration is printed.
const mask = "****"

// Masked returns a copy for printing, with every secret that is set shown as
// "****" (an unset secret stays empty, so that it shows as unset).
func (c Config) Masked() Config {
	for _, s := range []*string{&c.AdminToken, &c.RetrySecret, &c.RetrySecretPrevious, &c.RedisPassword, &c.KafkaSASLPassword} {
		if *s != "" {
			*s = mask
		}
	}
	c.KafkaBrokers = slices.Clone(c.KafkaBrokers)
	c.SourceTopics = slices.Clone(c.SourceTopics)
	c.RedisAddrs = slices.Clone(c.RedisAddrs)
	c.Roles = slices.Clone(c.Roles)
	return c
}

// ConfigKeys returns the variable names of Config's fields in field order,
// as envconfig derives them.
func ConfigKeys() ([]string, error) {
	var buf bytes.Buffer
	if err := envconfig.Usagef(EnvPrefix, &Config{}, &buf, "{{range .}}{{usage_key .}}\n{{end}}"); err != nil {
		return nil, err
	}
	return strings.Fields(buf.String()), nil
}

// Environ returns the configuration as KEY=value lines, in field order, as
// they could be given to the process. Print only a Masked copy.
func (c Config) Environ() ([]string, error) {
	keys, err := ConfigKeys()
	if err != nil {
		return nil, err
	}
	fields := leafFields(reflect.ValueOf(c), nil)
	if len(keys) != len(fields) {
		return nil, fmt.Errorf("config has %d fields, envconfig sees %d", len(fields), len(keys))
	}
	out := make([]string, 0, len(keys))
	for i, k := range keys {
		var s string
		switch f := fields[i].Interface().(type) {
		case []string:
			s = strings.Join(f, ",")
		default:
			s = fmt.Sprint(f)
		}
		out = append(out, k+"="+s)
	}
	return out, nil
}

// leafFields appends to out the exported fields of the struct v that
// envconfig reads, in its order: those of an embedded group in its place.
func leafFields(v reflect.Value, out []reflect.Value) []reflect.Value {
	for i := range v.NumField() {
		f := v.Type().Field(i)
		switch {
		case !f.IsExported():
		case f.Anonymous && f.Type.Kind() == reflect.Struct:
			out = leafFields(v.Field(i), out)
		default:
			out = append(out, v.Field(i))
		}
	}
	return out
}

// UnknownVars lists GATEKEEPER_* variables in env that configure nothing,
// most likely typos. GATEKEEPER_TEST_* (test servers) are not reported.
func UnknownVars(env []string) ([]string, error) {
	keys, err := ConfigKeys()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, EnvPrefix+"_") && !strings.HasPrefix(k, EnvPrefix+"_TEST_") && !slices.Contains(keys, k) {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out, nil
}
