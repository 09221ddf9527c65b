package integration

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/gatekeeper-dev/gatekeeper/deploy"
)

// notDriven are the metric names of the dashboard and the alert rules that
// this test does not make appear: labelled counters with no series until
// their first increment, which needs more than a short test. Each is checked
// only as registered, by internal/worker's TestMonitoringMetricsRegistered
// (which reads the collectors' descriptions, series or not); every other
// name must be in the scrape.
var notDriven = map[string]string{
	"gatekeeper_handover_skipped_total":           "needs a retry-tier partition handed over between two replicas, with a done set in the last commit's metadata",
	"gatekeeper_handover_truncated_commits_total": "needs a retry-tier done set beyond the 4096 bytes of offset metadata",
	"gatekeeper_handover_distrusted_total":        "needs a forged or stale done set in a retry tier's commit metadata, met by the next owner at a handover",
}

// TestOpsMonitoringMetricsExported checks that the running binary exports
// every metric the dashboard (deploy/grafana/gatekeeper.json) and the alert
// rules (deploy/prometheus/gatekeeper-rules.yaml) use, names read out of
// their expressions by deploy.MonitoringMetricNames. It drives one
// gatekeeper until the lazily created series exist: admissions, deferrals
// released from the first retry tier (reserved, lateness, waiting), a
// rejection, an invalid event, an oversized event, an unsigned event in a
// retry tier (signature failure), a shared capacity (that never binds),
// and offsets Kafka deleted before the gatekeeper read them (offsets lost).
// Then every name must be in one scrape of /metrics, except those of
// notDriven.
func TestOpsMonitoringMetricsExported(t *testing.T) {
	t.Parallel()
	opsAvoidDayEnd(t)
	used, err := deploy.MonitoringMetricNames()
	if err != nil {
		t.Fatal(err)
	}
	for name, why := range notDriven {
		if _, ok := used[name]; !ok {
			t.Errorf("notDriven %s (%s): no longer used by the dashboard or the rules; drop it from the list", name, why)
		}
	}

	f := newFlow(t, 3)
	group := "gk-" + f.Source
	opsDeleteBeforeStart(t, f.Source, group)

	limits := filepath.Join(t.TempDir(), "limits.yaml")
	if err := os.WriteFile(limits, []byte("default: [3/1s]\ntenants:\n  big: [1/1m]\n  tiny: [1/1d]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	gk := startGatekeeper(t, "gk", f.env(t,
		"GATEKEEPER_GROUP_ID", group,
		"GATEKEEPER_LIMITS_FILE", limits,
		"GATEKEEPER_RETRY_SECRET", strings.Repeat("s", 32),
		"GATEKEEPER_MAX_MESSAGE_BYTES", "20000",
		// A capacity that never binds here: its metrics exist only with one.
		"GATEKEEPER_CAPACITY", "100000/1s"))
	gk.waitReady(90 * time.Second)

	large := bytes.Repeat([]byte("x"), 19700)
	msgs := append(opsMessages("busy", 9), opsMessages("tiny", 3)...) // busy: admit and defer by a second or two; tiny: admit, defer, reject
	msgs = append(msgs,
		kafka.Message{Partition: 0, Key: []byte("big"), Value: large},                              // admitted
		kafka.Message{Partition: 0, Key: []byte("big"), Value: large},                              // deferred: the retry tier takes up to its own max.message.bytes
		kafka.Message{Partition: 2, Key: []byte("whale"), Value: bytes.Repeat([]byte("x"), 20500)}, // admitted, too large by itself downstream: oversized
		kafka.Message{Partition: 1, Key: nil, Value: []byte("no tenant")},
	)
	produce(t, f.Source, msgs)
	produce(t, f.Retry, []kafka.Message{{Partition: 0, Key: []byte("forger"), Value: []byte("unsigned")}})

	// The series come from what the test drove, not from elsewhere. Known
	// series exist at 0 from start-up, so being present is not enough: wait
	// for the values the test drives.
	driven := []struct {
		name   string
		labels map[string]string
		want   float64 // 0: at least 1
	}{
		{"gatekeeper_offsets_lost_total", map[string]string{"topic": f.Source}, 3},
		{"gatekeeper_retry_sig_failures_total", map[string]string{"reason": "missing"}, 1},
		{"gatekeeper_oversized_total", nil, 1},
		{"gatekeeper_decisions_total", map[string]string{"decision": "reserved"}, 0},
		{"gatekeeper_decisions_total", map[string]string{"decision": "reject"}, 1},
		// The event without a key, and the unsigned one (the retrier counts it invalid too).
		{"gatekeeper_decisions_total", map[string]string{"decision": "invalid"}, 2},
		{"gatekeeper_ready", map[string]string{"check": "consumption"}, 1},
	}
	var missing, wrong []string
	waitFor(t, 90*time.Second, "every metric of the monitoring files in /metrics, with the driven values", func() (bool, string) {
		fams := opsMetrics(t, gk)
		exported := map[string]bool{}
		for name := range fams {
			exported[name] = true
		}
		missing = missing[:0]
		for name := range used {
			if _, skip := notDriven[name]; !skip && !deploy.MetricIn(name, exported) {
				missing = append(missing, name)
			}
		}
		slices.Sort(missing)
		wrong = wrong[:0]
		for _, c := range driven {
			want := "at least 1"
			if c.want > 0 {
				want = fmt.Sprint(c.want)
			}
			if v, ok := opsValue(fams, c.name, c.labels); !ok || v < 1 || (c.want > 0 && v != c.want) {
				wrong = append(wrong, fmt.Sprintf("%s%v: got %v (present %v), want %s", c.name, c.labels, v, ok, want))
			}
		}
		return len(missing) == 0 && len(wrong) == 0, fmt.Sprintf("missing %v; values %v", missing, wrong)
	})
	t.Logf("%d metric names of the monitoring files in one scrape; not driven (checked as registered only): %v",
		len(used)-len(notDriven), slices.Sorted(maps.Keys(notDriven)))
	if code, took := gk.terminate(30 * time.Second); code != 0 {
		t.Errorf("exit code after SIGTERM: got %d, want 0 (took %v)", code, took)
	}
}

// opsDeleteBeforeStart makes the group's first fetch of partition 0 of
// topic jump over deleted events: it commits offset 0 for the group, writes
// three events and deletes them (DeleteRecords), so that the log starts at
// 3 while the group's committed offset is 0.
func opsDeleteBeforeStart(t *testing.T, topic, group string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := adminClient().OffsetCommit(ctx, &kafka.OffsetCommitRequest{
		GroupID: group, GenerationID: -1,
		Topics: map[string][]kafka.OffsetCommit{topic: {{Partition: 0, Offset: 0}}},
	})
	if err != nil {
		t.Fatalf("commit offset 0 for %s: %v", group, err)
	}
	for _, p := range res.Topics[topic] {
		if p.Error != nil {
			t.Fatalf("commit offset 0 for %s: %v", group, p.Error)
		}
	}
	produce(t, topic, []kafka.Message{{Partition: 0, Value: []byte("gone")}, {Partition: 0, Value: []byte("gone")}, {Partition: 0, Value: []byte("gone")}})
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafkaAddr()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	req := kmsg.NewPtrDeleteRecordsRequest()
	req.TimeoutMillis = 30000
	rt := kmsg.NewDeleteRecordsRequestTopic()
	rt.Topic = topic
	rp := kmsg.NewDeleteRecordsRequestTopicPartition()
	rp.Partition, rp.Offset = 0, 3
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatalf("delete records of %s/0: %v", topic, err)
	}
	for _, rt := range resp.Topics {
		for _, rp := range rt.Partitions {
			if err := kerr.ErrorForCode(rp.ErrorCode); err != nil || rp.LowWatermark != 3 {
				t.Fatalf("delete records of %s/%d: low watermark %d, error %v; want 3, none", topic, rp.Partition, rp.LowWatermark, err)
			}
		}
	}
}
