package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"

	"github.com/segmentio/kafka-go"

	"github.com/gatekeeper-dev/gatekeeper/internal/consume"
)

// metadataMaxConfig is the broker setting that bounds a commit's metadata.
const metadataMaxConfig = "offset.metadata.max.bytes"

// readMetadataMax returns the smallest offset.metadata.max.bytes of the
// brokers, read with DescribeConfigs: the retry tiers' commits carry their
// done set in the offset metadata, and a commit whose metadata is larger is
// refused (the partition would never commit again). When the brokers cannot
// be asked (ACLs, an old broker) it logs and returns Kafka's default.
func readMetadataMax(ctx context.Context, p Pipeline) int {
	n, err := brokersMetadataMax(ctx, p)
	if err != nil {
		p.Log.Warn("could not read the brokers' "+metadataMaxConfig+"; the retry tiers' commit metadata is kept within Kafka's default",
			slog.Int("bytes", consume.DefaultMetadataMax), slog.String("err", err.Error()))
		return consume.DefaultMetadataMax
	}
	return n
}

func brokersMetadataMax(ctx context.Context, p Pipeline) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, p.Config.KafkaTimeout)
	defer cancel()
	client := &kafka.Client{Addr: kafka.TCP(p.Config.KafkaBrokers...), Timeout: p.Config.KafkaTimeout}
	if p.Transport != nil {
		client.Transport = p.Transport
	}
	md, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{}})
	if err != nil {
		return 0, fmt.Errorf("metadata: %w", err)
	}
	req := &kafka.DescribeConfigsRequest{}
	for _, b := range md.Brokers {
		req.Resources = append(req.Resources, kafka.DescribeConfigRequestResource{
			ResourceType: kafka.ResourceTypeBroker, ResourceName: strconv.Itoa(b.ID), ConfigNames: []string{metadataMaxConfig}})
	}
	if len(req.Resources) == 0 {
		return 0, errors.New("no brokers")
	}
	least := 0
	for _, r := range req.Resources {
		// A broker's own configuration is answered by that broker only.
		res, err := client.DescribeConfigs(ctx, &kafka.DescribeConfigsRequest{Resources: []kafka.DescribeConfigRequestResource{r}})
		if err != nil {
			return 0, fmt.Errorf("describe broker %s: %w", r.ResourceName, err)
		}
		for _, rr := range res.Resources {
			if rr.Error != nil {
				return 0, fmt.Errorf("broker %s: %w", rr.ResourceName, rr.Error)
			}
			for _, e := range rr.ConfigEntries {
				if e.ConfigName != metadataMaxConfig {
					continue
				}
				n, err := strconv.Atoi(e.ConfigValue)
				if err != nil || n <= 0 {
					return 0, fmt.Errorf("broker %s: %s=%q", rr.ResourceName, metadataMaxConfig, e.ConfigValue)
				}
				if least == 0 || n < least {
					least = n
				}
			}
		}
	}
	if least == 0 {
		return 0, errors.New(metadataMaxConfig + " not in the brokers' answers")
	}
	return least, nil
}
