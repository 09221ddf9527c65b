package worker

import (
	"bytes"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/kelseyhightower/envconfig"
)

// TestDefaultConfig checks that DefaultConfig holds, for every variable left
// unset, the value that LoadConfig reads: envconfig and DefaultConfig apply
// the same tags.
func TestDefaultConfig(t *testing.T) {
	setEnv(t, minimal())
	loaded, err := LoadConfig()
	if err != nil {
		t.Fatal(err)
	}
	want := *loaded
	// What the minimal configuration sets, and what is derived from it.
	want.SourceTopics, want.DownstreamTopic, want.Limits = nil, "", ""
	want.RetryTopic, want.DLQTopic = "", ""
	want.limits, want.tls = nil, nil
	got := DefaultConfig()
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(Config{})); diff != "" {
		t.Errorf("DefaultConfig() differs from LoadConfig's defaults (-want +got):\n%s", diff)
	}
}

// TestUsageVarsAreTheUsageGroups checks that the variables usageVar accepts
// are those of the groups LoadUsageConfig reads.
func TestUsageVarsAreTheUsageGroups(t *testing.T) {
	var groups []string
	for _, g := range []any{&RedisConfig{}, &LimitsConfig{}} {
		var buf bytes.Buffer
		if err := envconfig.Usagef(EnvPrefix, g, &buf, "{{range .}}{{usage_key .}}\n{{end}}"); err != nil {
			t.Fatal(err)
		}
		groups = append(groups, strings.Fields(buf.String())...)
	}
	keys, err := ConfigKeys()
	if err != nil {
		t.Fatal(err)
	}
	var usage []string
	for _, k := range keys {
		if usageVar(strings.TrimPrefix(k, EnvPrefix+"_")) {
			usage = append(usage, k)
		}
	}
	slices.Sort(groups)
	slices.Sort(usage)
	if !reflect.DeepEqual(groups, usage) {
		t.Errorf("the Redis and Limits groups read %v, usageVar accepts %v", groups, usage)
	}
}
