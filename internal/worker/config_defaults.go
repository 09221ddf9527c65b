package worker

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"
)

// DefaultConfig returns the configuration of the `default` tags alone, the
// one source of the defaults (envconfig applies the same tags, and the
// README's table prints them): what the demo starts from. The required
// variables and the defaults computed from others (RETRY_TOPIC, DLQ_TOPIC)
// stay empty.
func DefaultConfig() Config {
	var c Config
	if err := applyDefaults(reflect.ValueOf(&c).Elem()); err != nil {
		panic("worker: a default tag of Config does not parse: " + err.Error())
	}
	return c
}

// applyDefaults sets every exported field of the struct v, and of the
// structs embedded in it, to its `default` tag, as envconfig reads it.
func applyDefaults(v reflect.Value) error {
	for i := range v.NumField() {
		f, field := v.Type().Field(i), v.Field(i)
		if !f.IsExported() {
			continue
		}
		if f.Anonymous && field.Kind() == reflect.Struct {
			if err := applyDefaults(field); err != nil {
				return err
			}
			continue
		}
		def, ok := f.Tag.Lookup("default")
		if !ok {
			continue
		}
		if err := setDefault(field, def); err != nil {
			return fmt.Errorf("%s: %w", f.Name, err)
		}
	}
	return nil
}

func setDefault(field reflect.Value, def string) error {
	switch field.Interface().(type) {
	case string:
		field.SetString(def)
	case bool:
		b, err := strconv.ParseBool(def)
		if err != nil {
			return err
		}
		field.SetBool(b)
	case int:
		n, err := strconv.Atoi(def)
		if err != nil {
			return err
		}
		field.SetInt(int64(n))
	case time.Duration:
		d, err := time.ParseDuration(def)
		if err != nil {
			return err
		}
		field.SetInt(int64(d))
	case []string:
		field.Set(reflect.ValueOf(strings.Split(def, ",")))
	default:
		return fmt.Errorf("no default of type %s", field.Type())
	}
	return nil
}
