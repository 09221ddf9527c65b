package pace

import (
	"context"
	"fmt"
	"math"
	"syscall"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/gatekeeper-dev/gatekeeper/internal/testenv"
)

// BenchmarkLeaderInterval is what the replica that computes the rate does
// per interval, against real Kafka and Redis: four reads of a downstream
// group (a topic of four partitions), four samples observed, the lease
// renewed and the rate published once. It reports the process's CPU per
// interval (getrusage: user and system), the cost that pacing adds to the
// leader whatever the event rate; compare with the gate's CPU per event.
// "every sample" does what the runner did before: the partitions, first
// offsets and members read with every sample, the lease renewed and the
// rate published with every sample.
func BenchmarkLeaderInterval(b *testing.B) {
	b.Run("as now", func(b *testing.B) { benchLeader(b, time.Second, 0, false) })
	b.Run("every sample", func(b *testing.B) { benchLeader(b, 0, time.Nanosecond, true) })
}

func benchLeader(b *testing.B, membersEvery, metaEvery time.Duration, perSample bool) {
	addr := testenv.Kafka(b)
	rdb, _ := testenv.Redis(b)
	prefix := testenv.Prefix(b, rdb)
	ctx := context.Background()
	client := &kafka.Client{Addr: kafka.TCP(addr), Timeout: 10 * time.Second}
	topic := fmt.Sprintf("pace-bench-%d", time.Now().UnixNano())
	res, err := client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{Topic: topic, NumPartitions: 4, ReplicationFactor: 1}}})
	if err != nil || res.Errors[topic] != nil {
		b.Fatalf("create topic: %v %v", err, res)
	}
	defer client.DeleteTopics(context.Background(), &kafka.DeleteTopicsRequest{Topics: []string{topic}})
	d := &Downstream{Client: client, Group: topic + "-down", Topic: topic, Timeout: 5 * time.Second, MembersEvery: membersEvery, MetaEvery: metaEvery}
	for {
		if _, err = d.Read(ctx); err == nil {
			break
		}
		time.Sleep(200 * time.Millisecond) // the topic's leader is not known yet
	}
	f := NewFleet(rdb, prefix, time.Second)
	p := Params{TargetWait: 2 * time.Second, Floor: 10, Ceiling: 1000, Interval: time.Second, Hold: time.Minute}
	c := NewController(p, 100)
	at := time.Now()
	var ru0, ru1 syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := f.Lease(ctx, "bench", 5*time.Second); err != nil {
			b.Fatal(err)
		}
		var e Estimate
		for k := 0; k < 4; k++ {
			s, err := d.Read(ctx)
			if err != nil {
				b.Fatal(err)
			}
			at = at.Add(SampleEvery(p.Interval))
			s.At = at
			e = c.Observe(s)
			if perSample && k < 3 {
				if _, err := f.Lease(ctx, "bench", 5*time.Second); err != nil {
					b.Fatal(err)
				}
				if _, err := f.Publish(ctx, Paced{Estimate: e, At: at, By: "bench"}); err != nil {
					b.Fatal(err)
				}
			}
		}
		if _, err := f.Publish(ctx, Paced{Estimate: e, At: at, By: "bench"}); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
	cpu := time.Duration(syscall.TimevalToNsec(ru1.Utime) - syscall.TimevalToNsec(ru0.Utime) + syscall.TimevalToNsec(ru1.Stime) - syscall.TimevalToNsec(ru0.Stime))
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-us/interval")
}

// BenchmarkControllerObserve is the controller's own work per sample (no
// I/O): a recorded stream of four samples a second (a drain of 300/s cut
// to 150/s, then 1,500/s, commits every 200 ms) replayed into a controller.
// It is the path that pacing adds to the leader besides its reads; run it
// under callgrind to count its instructions repeatably.
func BenchmarkControllerObserve(b *testing.B) {
	p := Params{TargetWait: 2 * time.Second, Floor: 50, Ceiling: 3000, Interval: time.Second, Hold: 10 * time.Second}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var samples []Sample
	var committed, done, end float64
	for at := time.Duration(0); at < 85*time.Second; at += 50 * time.Millisecond {
		drain := map[bool]float64{true: 300, false: 150}[at < 25*time.Second]
		if at >= 45*time.Second {
			drain = 1500
		}
		end += 1.2 * drain * 0.05
		done = math.Min(end, done+drain*0.05)
		if at%(200*time.Millisecond) == 0 {
			committed = done
		}
		if at%SampleEvery(p.Interval) == 0 {
			samples = append(samples, Sample{At: t0.Add(at), Committed: int64(committed), End: int64(end), Members: 1})
		}
	}
	b.ResetTimer()
	for i := 0; i < b.N; {
		c := NewController(p, p.Floor)
		for _, s := range samples {
			if i == b.N {
				break
			}
			c.Observe(s)
			i++
		}
	}
}
