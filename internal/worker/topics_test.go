package worker

import (
	"strings"
	"testing"
	"time"

	"github.com/gatekeeper-dev/gatekeeper/internal/route"
)

func TestCheckTopicLimits(t *testing.T) {
	topics := route.Topics{Downstream: "down", Retry: "down.retry", DLQ: "down.dlq"}
	tiers := topics.Tiers()
	outputs := []string{"down", "down.dlq", "down.retry", "down.retry.1h", "down.retry.long"}
	week := 7 * 24 * time.Hour
	ok := func() map[string]topicLimits {
		m := map[string]topicLimits{}
		for _, o := range outputs {
			m[o] = topicLimits{retention: week, maxMessageBytes: 1048588, retentionBytes: -1, cleanupPolicy: "delete"}
		}
		return m
	}
	tests := []struct {
		name    string
		horizon time.Duration
		edit    func(map[string]topicLimits)
		want    string // substring of the error; empty: no error
	}{
		{name: "defaults", horizon: 24 * time.Hour},
		{name: "unlimited retention", horizon: 24 * time.Hour, edit: func(m map[string]topicLimits) { m["down.retry.long"] = topicLimits{retention: -1, retentionBytes: -1} }},
		{name: "unknown settings", horizon: 24 * time.Hour, edit: func(m map[string]topicLimits) { delete(m, "down.retry.long") }},
		{name: "horizon past the long tier", horizon: 48 * time.Hour,
			edit: func(m map[string]topicLimits) {
				m["down.retry.long"] = topicLimits{retention: 24 * time.Hour, retentionBytes: -1}
			},
			want: "GATEKEEPER_DEFER_HORIZON: 48h0m0s: retry tier down.retry.long keeps events 24h0m0s"},
		{name: "hour tier shorter than an hour", horizon: 24 * time.Hour,
			edit: func(m map[string]topicLimits) {
				m["down.retry.1h"] = topicLimits{retention: 30 * time.Minute, retentionBytes: -1}
			},
			want: "retry tier down.retry.1h keeps events 30m0s"},
		{name: "downstream smaller than MAX_MESSAGE_BYTES", horizon: 24 * time.Hour,
			edit: func(m map[string]topicLimits) { m["down"] = topicLimits{retention: week, maxMessageBytes: 500000} },
			want: "GATEKEEPER_MAX_MESSAGE_BYTES: 1048576 is above max.message.bytes 500000 of topic down"},
		{name: "retry tier bounded in bytes", horizon: 24 * time.Hour,
			edit: func(m map[string]topicLimits) {
				m["down.retry"] = topicLimits{retention: week, retentionBytes: 1 << 30}
			},
			want: "GATEKEEPER_RETRY_TOPIC: retry tier down.retry has retention.bytes 1073741824"},
		{name: "long tier bounded in bytes", horizon: 24 * time.Hour,
			edit: func(m map[string]topicLimits) { m["down.retry.long"] = topicLimits{retention: -1, retentionBytes: 0} },
			want: "retry tier down.retry.long has retention.bytes 0"},
		{name: "retry tier compacted", horizon: 24 * time.Hour,
			edit: func(m map[string]topicLimits) {
				m["down.retry.1h"] = topicLimits{retention: week, retentionBytes: -1, cleanupPolicy: "compact"}
			},
			want: "GATEKEEPER_RETRY_TOPIC: retry tier down.retry.1h has cleanup.policy compact"},
		{name: "retry tier compacted and deleted", horizon: 24 * time.Hour,
			edit: func(m map[string]topicLimits) {
				m["down.retry"] = topicLimits{retention: week, retentionBytes: -1, cleanupPolicy: "compact,delete"}
			},
			want: "retry tier down.retry has cleanup.policy compact,delete"},
		{name: "downstream bounded in bytes and compacted", horizon: 24 * time.Hour,
			edit: func(m map[string]topicLimits) {
				m["down"] = topicLimits{retention: week, maxMessageBytes: 1048588, retentionBytes: 1 << 30, cleanupPolicy: "compact"}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			limits := ok()
			if tt.edit != nil {
				tt.edit(limits)
			}
			cfg := &Config{LimitsConfig: LimitsConfig{DeferHorizon: tt.horizon}, BoundsConfig: BoundsConfig{MaxMessageBytes: 1 << 20}}
			err := checkTopicLimits(cfg, tiers, outputs, limits)
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("got %v, want no error", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("got %v, want an error containing %q", err, tt.want)
			case err != nil && strings.Contains(err.Error(), "\n"):
				t.Errorf("error is not one line: %q", err)
			}
		})
	}
}
