package worker

import (
	"context"
	"testing"
	"time"

	"github.com/gatekeeper-dev/gatekeeper/internal/testenv"
)

// The retry tiers' commit metadata is sized to what the real broker says
// (Kafka's default on the test broker); a broker that cannot be asked
// leaves Kafka's default, with a warning.
func TestReadMetadataMax(t *testing.T) {
	broker := testenv.Kafka(t)
	p := Pipeline{Config: &Config{KafkaConfig: KafkaConfig{KafkaBrokers: []string{broker}, KafkaTimeout: 10 * time.Second}}, Log: testenv.DiscardLogger()}
	n, err := brokersMetadataMax(context.Background(), p)
	if err != nil || n != 4096 {
		t.Fatalf("brokersMetadataMax: got %d, %v; want 4096 (the test broker's offset.metadata.max.bytes), nil", n, err)
	}
	p.Config = &Config{KafkaConfig: KafkaConfig{KafkaBrokers: []string{"127.0.0.1:1"}, KafkaTimeout: time.Second}}
	if n := readMetadataMax(context.Background(), p); n != 4096 {
		t.Errorf("readMetadataMax without a broker: got %d, want the default 4096", n)
	}
}
