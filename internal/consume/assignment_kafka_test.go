package consume

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/gatekeeper-dev/gatekeeper/internal/testenv"
)

// Batch.Assignment names one ownership of one partition in this process: a
// partition that leaves a member at a rebalance and comes back carries a
// new one, so a Handler that remembers what it did per partition (the
// limiter's replay shortcut) knows another owner may have handled offsets
// in between.
func TestKafkaAssignmentChangesWithOwner(t *testing.T) {
	broker := testenv.Kafka(t)
	topic, group := createTopic(t, broker), uniqueName(t, "group")

	type seenAt struct {
		member, partition int
	}
	var mu sync.Mutex
	phase := 1
	owners := map[uint64]seenAt{}           // assignment -> where it was seen
	byPhase := map[[2]int]map[uint64]bool{} // (phase, partition) -> member 0's assignments
	latest := make([]*kafka.Generation, 2)
	newMember := func(i int) *Group {
		g, err := NewGroup(testConfig(t, broker, group, topic), HandlerFunc(func(_ context.Context, b Batch) error {
			mu.Lock()
			defer mu.Unlock()
			if b.Assignment == 0 {
				t.Errorf("member %d partition %d: batch with no assignment", i, b.Partition)
			}
			at := seenAt{i, b.Partition}
			if was, ok := owners[b.Assignment]; ok && was != at {
				t.Errorf("assignment %d seen at %+v and at %+v", b.Assignment, was, at)
			}
			owners[b.Assignment] = at
			if i == 0 {
				k := [2]int{phase, b.Partition}
				if byPhase[k] == nil {
					byPhase[k] = map[uint64]bool{}
				}
				byPhase[k][b.Assignment] = true
			}
			return nil
		}))
		if err != nil {
			t.Fatalf("NewGroup: %v", err)
		}
		g.m.onGeneration = func(gen *kafka.Generation) {
			mu.Lock()
			defer mu.Unlock()
			latest[i] = gen
		}
		return g
	}
	parts := func(i int) int {
		if latest[i] == nil {
			return 0
		}
		return len(latest[i].Assignments[topic])
	}
	handled := func(label string) {
		produce(t, broker, topic, values(60, label))
		end := endOffsets(t, broker, topic)
		eventually(t, 30*time.Second, label+": every partition's end committed", func() bool {
			got := committedOffsets(t, broker, group, topic)
			for p, o := range end {
				if got[p] != o {
					return false
				}
			}
			return true
		})
	}

	stop0 := runInBackground(t, newMember(0).Run)
	eventually(t, 30*time.Second, "member 0 owns every partition", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return parts(0) == testPartitions
	})
	handled("alone")

	// A second member takes some partitions, then leaves them to member 0 again.
	mu.Lock()
	phase = 2
	mu.Unlock()
	stop1 := runInBackground(t, newMember(1).Run)
	eventually(t, 30*time.Second, "both members share the partitions", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return parts(0) > 0 && parts(1) > 0 && latest[0].ID == latest[1].ID
	})
	handled("shared")
	if err := stop1(); err != nil {
		t.Fatalf("member 1: %v", err)
	}
	eventually(t, 30*time.Second, "member 0 owns every partition again", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return parts(0) == testPartitions
	})
	mu.Lock()
	phase = 3
	mu.Unlock()
	handled("again")
	if err := stop0(); err != nil {
		t.Fatalf("member 0: %v", err)
	}

	mu.Lock()
	defer mu.Unlock()
	compared := 0
	for p := range testPartitions {
		before, after := byPhase[[2]int{1, p}], byPhase[[2]int{3, p}]
		if len(before) == 0 || len(after) == 0 {
			continue
		}
		compared++
		for a := range after {
			if before[a] {
				t.Errorf("partition %d: assignment %d both before and after the rebalances", p, a)
			}
		}
	}
	if compared == 0 {
		t.Fatalf("no partition handled by member 0 both alone and again: %v", fmt.Sprint(byPhase))
	}
	t.Logf("%d partitions compared; %d assignments seen", compared, len(owners))
}
