package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"

	"github.com/gatekeeper-dev/gatekeeper/internal/testenv"
)

// Helpers of the gate pipeline tests (gate_test.go, kill_test.go,
// redis_outage_test.go, shutdown_test.go).

// ev is what a test event's value says about it: a unique id, the source
// partition it was produced to, and its sequence number among the events of
// its tenant in that partition. Admitted events carry no origin headers, so
// the value is the only way to tell where they came from.
type ev struct {
	ID, Part, Seq int
}

func (e ev) value() []byte { return fmt.Appendf(nil, "ev %d %d %d", e.ID, e.Part, e.Seq) }

// parseEv reads the ev of a test event; ok is false for a value not made by eventGen.
func parseEv(m kafka.Message) (e ev, ok bool) {
	n, err := fmt.Sscanf(string(m.Value), "ev %d %d %d", &e.ID, &e.Part, &e.Seq)
	return e, err == nil && n == 3
}

// eventGen makes keyed test events with unique ids, spread over the source
// partitions, their tenant (the key) drawn with the given weights.
// Sequence numbers continue across calls of next.
type eventGen struct {
	parts   int
	tenants []string
	weights []int
	rnd     *rand.Rand
	nextID  int
	seq     map[string]int // "<tenant>/<partition>" -> next seq
	tenant  map[int]string // id -> tenant
}

func newEventGen(parts int, tenants []string, weights []int) *eventGen {
	return &eventGen{parts: parts, tenants: tenants, weights: weights, rnd: rand.New(rand.NewPCG(7, 11)),
		seq: map[string]int{}, tenant: map[int]string{}}
}

// next returns n more events.
func (g *eventGen) next(n int) []kafka.Message {
	total := 0
	for _, w := range g.weights {
		total += w
	}
	msgs := make([]kafka.Message, 0, n)
	for range n {
		r, i := g.rnd.IntN(total), 0
		for r >= g.weights[i] {
			r -= g.weights[i]
			i++
		}
		tenant, part := g.tenants[i], g.rnd.IntN(g.parts)
		k := tenant + "/" + strconv.Itoa(part)
		e := ev{ID: g.nextID, Part: part, Seq: g.seq[k]}
		g.nextID++
		g.seq[k]++
		g.tenant[e.ID] = tenant
		msgs = append(msgs, kafka.Message{Partition: part, Key: []byte(tenant), Value: e.value()})
	}
	return msgs
}

// outputs is everything a flow has written so far.
type outputs struct {
	down, retry, dlq []kafka.Message
}

func readOutputs(t testing.TB, f flow) outputs {
	t.Helper()
	return outputs{down: readTopic(t, f.Downstream), retry: f.readRetry(t), dlq: readTopic(t, f.DLQ)}
}

func (o outputs) all() []kafka.Message {
	return slices.Concat(o.down, o.retry, o.dlq)
}

func (o outputs) String() string {
	return fmt.Sprintf("%d downstream + %d retry + %d dead-letter", len(o.down), len(o.retry), len(o.dlq))
}

// idCounts counts how often each test event id occurs in msgs; events
// without a test value are counted under -1.
func idCounts(msgs []kafka.Message) map[int]int {
	c := map[int]int{}
	for _, m := range msgs {
		e, ok := parseEv(m)
		if !ok {
			c[-1]++
			continue
		}
		c[e.ID]++
	}
	return c
}

// missingIDs returns the ids in [0, n) that counts lacks, and how many
// occurrences beyond the first it holds (duplicates).
func missingIDs(counts map[int]int, n int) (missing []int, dups int) {
	for id := range n {
		if counts[id] == 0 {
			missing = append(missing, id)
		} else {
			dups += counts[id] - 1
		}
	}
	return missing, dups
}

// waitAllRouted waits until every id in [0, n) is found in the flow's
// outputs and returns them.
func waitAllRouted(t testing.TB, f flow, n int, timeout time.Duration) outputs {
	t.Helper()
	var o outputs
	waitFor(t, timeout, "every event routed", func() (bool, string) {
		o = readOutputs(t, f)
		missing, _ := missingIDs(idCounts(o.all()), n)
		return len(missing) == 0, fmt.Sprintf("%s; %d of %d ids missing", o, len(missing), n)
	})
	return o
}

// headerInt returns header k of m as an integer, failing the test if it is
// missing or not a number.
func headerInt(t testing.TB, m kafka.Message, k string) int64 {
	t.Helper()
	v, err := strconv.ParseInt(header(m, k), 10, 64)
	if err != nil {
		t.Errorf("%s/%d@%d: header %s: got %q, want a number", m.Topic, m.Partition, m.Offset, k, header(m, k))
	}
	return v
}

// counterWindow is one aligned counter window read from Redis.
type counterWindow struct {
	Key, Tenant   string
	Window        string // the rule's counter: "1m", "1h", "1m/bytes" (limit.Rule.Counter)
	Count         int64
	Start, Expire int64 // unix ms
}

// readWindows returns every aligned window key under prefix:
// <prefix>:{<tenant>}:<window>:<start ms> (see internal/limit/keys.go), with
// its count. Frontier and other keys are left out. Tenants must be plain
// names (no encoding).
func readWindows(t testing.TB, addr, prefix string) []counterWindow {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	re := regexp.MustCompile(`^` + regexp.QuoteMeta(prefix) + `:\{([^}]*)\}:(\d+[a-z]+(?:/bytes|/units)?):(\d+)$`)
	var out []counterWindow
	iter := rdb.Scan(ctx, 0, prefix+":*", 1000).Iterator()
	for iter.Next(ctx) {
		key := iter.Val()
		sm := re.FindStringSubmatch(key)
		if sm == nil {
			continue
		}
		v, err := rdb.HMGet(ctx, key, "count", "expire").Result()
		if err != nil {
			t.Fatalf("hmget %s: %v", key, err)
		}
		w := counterWindow{Key: key, Tenant: sm[1], Window: sm[2]}
		w.Start, _ = strconv.ParseInt(sm[3], 10, 64)
		c, _ := v[0].(string)
		e, _ := v[1].(string)
		w.Count, _ = strconv.ParseInt(c, 10, 64)
		w.Expire, _ = strconv.ParseInt(e, 10, 64)
		out = append(out, w)
	}
	if err := iter.Err(); err != nil {
		t.Fatalf("scan %s:*: %v", prefix, err)
	}
	return out
}

// waitSharedGeneration waits until every process is a member of the same,
// latest generation of group and together they own each of the topic's
// partitions exactly once, each process at least one. It returns the
// partitions of each process.
func waitSharedGeneration(t testing.TB, group, topic string, partitions int, procs ...*gkProc) [][]string {
	t.Helper()
	owned := make([][]string, len(procs))
	waitFor(t, 90*time.Second, "members share the partitions in one generation", func() (bool, string) {
		var status []string
		seen := map[string]int{}
		ok, genID := true, -1
		for i, p := range procs {
			gens := p.Generations(group)
			if len(gens) == 0 {
				status = append(status, p.Name+": no generation")
				ok = false
				continue
			}
			g := gens[len(gens)-1]
			status = append(status, fmt.Sprintf("%s: generation %d %v", p.Name, g.ID, g.Partitions))
			if genID == -1 {
				genID = g.ID
			}
			if g.ID != genID || len(g.Partitions) == 0 {
				ok = false
			}
			owned[i] = g.Partitions
			for _, part := range g.Partitions {
				seen[part]++
			}
		}
		for i := range partitions {
			if seen[fmt.Sprintf("%s/%d", topic, i)] != 1 {
				ok = false
			}
		}
		return ok && len(seen) == partitions, strings.Join(status, "; ")
	})
	return owned
}

// metric returns the sum of the samples of a Prometheus counter or gauge in
// the process's /metrics whose name is name and whose labels contain every
// one of labels (`topic="x"`).
func (p *gkProc) metric(t testing.TB, name string, labels ...string) float64 {
	t.Helper()
	v, err := p.metricValue(name, labels...)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// metricValue is metric for any goroutine: it returns the error instead.
func (p *gkProc) metricValue(name string, labels ...string) (float64, error) {
	code, body, err := p.Get("/metrics")
	if err != nil || code != 200 {
		return 0, fmt.Errorf("%s /metrics: %d %v", p.Name, code, err)
	}
	sum := 0.0
	for l := range strings.Lines(body) {
		if !strings.HasPrefix(l, name+"{") && !strings.HasPrefix(l, name+" ") {
			continue
		}
		match := true
		for _, lb := range labels {
			match = match && strings.Contains(l, lb)
		}
		if !match {
			continue
		}
		f := strings.Fields(l)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err == nil {
			sum += v
		}
	}
	return sum, nil
}

// endOffsets returns the end offset (next offset to be written) of each partition of topic.
func endOffsets(t testing.TB, topic string, partitions int) map[int]int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out := map[int]int64{}
	for p := range partitions {
		conn, err := kafka.DialLeader(ctx, "tcp", kafkaAddr(), topic, p)
		if err != nil {
			t.Fatalf("dial %s/%d: %v", topic, p, err)
		}
		last, err := conn.ReadLastOffset()
		conn.Close()
		if err != nil {
			t.Fatalf("end offset of %s/%d: %v", topic, p, err)
		}
		out[p] = last
	}
	return out
}

// startRedisServer starts a private redis-server (testenv.StartRedisServer)
// on addr (host:port; a free port when empty), for tests that stop and
// restart Redis. It is killed when the test ends.
func startRedisServer(t testing.TB, addr string) *testenv.RedisServer {
	t.Helper()
	s, err := testenv.StartRedisServer(testenv.RedisOptions{Addr: addr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}
