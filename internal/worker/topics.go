package worker

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/gatekeeper-dev/gatekeeper/internal/route"
)

// topicLimits are the settings of a topic that bound what Gatekeeper may do
// with it: -1 means unlimited, 0 unknown.
type topicLimits struct {
	retention       time.Duration // retention.ms
	maxMessageBytes int           // max.message.bytes
}

// describeTopics reads retention.ms and max.message.bytes of topics.
func describeTopics(ctx context.Context, client *kafka.Client, topics []string) (map[string]topicLimits, error) {
	req := &kafka.DescribeConfigsRequest{}
	for _, t := range topics {
		req.Resources = append(req.Resources, kafka.DescribeConfigRequestResource{
			ResourceType: kafka.ResourceTypeTopic, ResourceName: t,
			ConfigNames: []string{"retention.ms", "max.message.bytes"},
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
		var l topicLimits
		for _, e := range r.ConfigEntries {
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
			}
		}
		out[r.ResourceName] = l
	}
	return out, nil
}

// checkTopicLimits refuses a configuration that would lose events or wedge
// a partition on these topics: a retry tier whose retention.ms is shorter
// than the longest an event waits in it (the tier's span; DEFER_HORIZON for
// the last), and an output topic whose max.message.bytes is below
// MAX_MESSAGE_BYTES. The error is one line naming the variable and the
// topic's setting.
func checkTopicLimits(cfg *Config, tiers []route.Tier, outputs []string, limits map[string]topicLimits) error {
	for _, tr := range tiers {
		wait := tr.UpperBound
		if wait == 0 {
			wait = cfg.DeferHorizon
		}
		l, ok := limits[tr.Topic]
		if ok && l.retention > 0 && l.retention < wait {
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

func lowerHint(tr route.Tier) string {
	if tr.UpperBound == 0 {
		return " or lower GATEKEEPER_DEFER_HORIZON"
	}
	return ""
}

// verifyTopicLimits reads the output topics' settings and checks them. A
// broker that refuses DescribeConfigs (ACLs) is logged and not checked.
func verifyTopicLimits(ctx context.Context, p Pipeline, topics route.Topics) error {
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
		p.Log.Warn("could not read the topics' retention.ms and max.message.bytes; not checked against DEFER_HORIZON and MAX_MESSAGE_BYTES",
			slog.String("err", err.Error()))
		return nil
	}
	return checkTopicLimits(p.Config, topics.Tiers(), outputs, limits)
}
