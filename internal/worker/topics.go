package worker

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/gatekeeper-dev/gatekeeper/internal/route"
)

// topicLimits are the settings of a topic that bound what Gatekeeper may do
// with it: -1 means unlimited, 0 unknown.
type topicLimits struct {
	retention       time.Duration // retention.ms
	maxMessageBytes int           // max.message.bytes
	retentionBytes  int64         // retention.bytes (-1: unbounded)
	cleanupPolicy   string        // cleanup.policy ("": unknown)
}

// describeTopics reads retention.ms, retention.bytes, cleanup.policy and
// max.message.bytes of topics.
func describeTopics(ctx context.Context, client *kafka.Client, topics []string) (map[string]topicLimits, error) {
	req := &kafka.DescribeConfigsRequest{}
	for _, t := range topics {
		req.Resources = append(req.Resources, kafka.DescribeConfigRequestResource{
			ResourceType: kafka.ResourceTypeTopic, ResourceName: t,
			ConfigNames: []string{"retention.ms", "retention.bytes", "cleanup.policy", "max.message.bytes"},
		})
	}
	res, err := client.DescribeConfigs(ctx, req)
	if err != nil {
		return nil, err
	}
	out := map[string]topicLimits{}
	for _, r := range res.Resources {
		if r.Error != nil {
			return nil, fmt.Errorf("topic %s: %w", r.ResourceName, r.Error)
		}
		l := topicLimits{retentionBytes: -1}
		for _, e := range r.ConfigEntries {
			if e.ConfigName == "cleanup.policy" {
				l.cleanupPolicy = e.ConfigValue
				continue
			}
			n, err := strconv.ParseInt(e.ConfigValue, 10, 64)
			if err != nil {
				continue
			}
			switch e.ConfigName {
			case "retention.ms":
				l.retention = time.Duration(n) * time.Millisecond
				if n < 0 {
					l.retention = -1
				}
			case "max.message.bytes":
				l.maxMessageBytes = int(n)
			case "retention.bytes":
				l.retentionBytes = n
			}
		}
		out[r.ResourceName] = l
	}
	return out, nil
}

// checkTopicLimits refuses a configuration that would lose events or wedge
// a partition on these topics: a retry tier whose retention.ms is shorter
// than the longest an event waits in it (the tier's span; DEFER_HORIZON for
// the last), a retry tier bounded in size (retention.bytes) or compacted
// (cleanup.policy), which delete deferred events before they are due
// whatever their age, and an output topic whose max.message.bytes is below
// MAX_MESSAGE_BYTES. The error is one line naming the variable and the
// topic's setting.
func checkTopicLimits(cfg *Config, tiers []route.Tier, outputs []string, limits map[string]topicLimits) error {
	for _, tr := range tiers {
		wait := tr.UpperBound
		if wait == 0 {
			wait = cfg.DeferHorizon
		}
		l, ok := limits[tr.Topic]
		if !ok {
			continue // not readable: not checked
		}
		if err := checkTierCleanup(tr.Topic, l); err != nil {
			return err
		}
		if l.retention > 0 && l.retention < wait {
			return bad("DEFER_HORIZON", "%v: retry tier %s keeps events %v (retention.ms %d), less than the %v an event may wait there; Kafka would delete deferred events before they are due: raise the topic's retention.ms (to at least %v plus the longest outage you want to survive)%s",
				cfg.DeferHorizon, tr.Topic, l.retention, l.retention.Milliseconds(), wait, wait, lowerHint(tr))
		}
	}
	for _, t := range outputs {
		if l, ok := limits[t]; ok && l.maxMessageBytes > 0 && l.maxMessageBytes < cfg.MaxMessageBytes {
			return bad("MAX_MESSAGE_BYTES", "%d is above max.message.bytes %d of topic %s: set it at most to the smallest max.message.bytes of the output topics",
				cfg.MaxMessageBytes, l.maxMessageBytes, t)
		}
	}
	return nil
}

// checkTierCleanup refuses a retry tier whose cleanup deletes events by
// anything but their age: retention.bytes other than -1 deletes the oldest
// segments once the partition holds that much, and cleanup.policy compact
// keeps only the last event of each key (a tenant's deferred events often
// share one). The retry tiers take their name from RETRY_TOPIC, which the
// error names.
func checkTierCleanup(topic string, l topicLimits) error {
	if l.retentionBytes >= 0 {
		return bad("RETRY_TOPIC", "retry tier %s has retention.bytes %d: Kafka would delete deferred events before they are due once a partition holds that much; set the topic's retention.bytes to -1 (unbounded) and bound it by retention.ms",
			topic, l.retentionBytes)
	}
	for _, p := range strings.Split(l.cleanupPolicy, ",") {
		if strings.TrimSpace(p) == "compact" {
			return bad("RETRY_TOPIC", "retry tier %s has cleanup.policy %s: compaction deletes deferred events before they are due (only the last of each key is kept); set the topic's cleanup.policy to delete",
				topic, l.cleanupPolicy)
		}
	}
	return nil
}

func lowerHint(tr route.Tier) string {
	if tr.UpperBound == 0 {
		return " or lower GATEKEEPER_DEFER_HORIZON"
	}
	return ""
}

// verifyTopicLimits reads the output topics' settings and checks them, and
// returns the max.message.bytes of the retry tiers whose value it read (nil
// when none): the Router's TopicMaxBytes. A broker that refuses DescribeConfigs
// (ACLs) is logged and not checked.
func verifyTopicLimits(ctx context.Context, p Pipeline, topics route.Topics) (map[string]int, error) {
	client := &kafka.Client{Addr: kafka.TCP(p.Config.KafkaBrokers...), Timeout: p.Config.KafkaTimeout, Transport: p.Transport}
	outputs := []string{topics.Downstream, topics.DLQ}
	names := append([]string(nil), outputs...)
	for _, tr := range topics.Tiers() {
		outputs = append(outputs, tr.Topic)
		names = append(names, tr.Topic)
	}
	dctx, cancel := context.WithTimeout(ctx, p.Config.KafkaTimeout)
	defer cancel()
	limits, err := describeTopics(dctx, client, names)
	if err != nil {
		p.Log.Warn("could not read the topics' retention.ms, retention.bytes, cleanup.policy and max.message.bytes; not checked against DEFER_HORIZON and MAX_MESSAGE_BYTES",
			slog.String("err", err.Error()))
		return nil, nil
	}
	if err := checkTopicLimits(p.Config, topics.Tiers(), outputs, limits); err != nil {
		return nil, err
	}
	return topicMaxBytes(topics.Tiers(), limits), nil
}

// topicMaxBytes returns the max.message.bytes of the retry tiers of limits
// that have one. MAX_MESSAGE_BYTES stays the limit of the downstream and
// dead-letter topics, which others read; the retry tiers are Gatekeeper's
// own, and a deferral needs room for its gk- headers beside the event.
func topicMaxBytes(tiers []route.Tier, limits map[string]topicLimits) map[string]int {
	out := map[string]int{}
	for _, tr := range tiers {
		if l := limits[tr.Topic]; l.maxMessageBytes > 0 {
			out[tr.Topic] = l.maxMessageBytes
		}
	}
	return out
}

// writerBatchBytes is the writer's batch size for records of at most
// MAX_MESSAGE_BYTES, or of the largest max.message.bytes of the retry tiers
// (topicMax): every record the Router lets through fits a batch alone, and a
// batch that a smaller topic refuses is split by the Router.
func writerBatchBytes(maxMessageBytes int, topicMax map[string]int) int64 {
	largest := maxMessageBytes
	for _, n := range topicMax {
		largest = max(largest, n)
	}
	return route.WriterBatchBytes(largest)
}
