package consume

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/gatekeeper-dev/gatekeeper/internal/testenv"
)

// memLeases is an in-memory Leases on the real clock. dead members renew
// nothing (a crashed process).
type memLeases struct {
	mu   sync.Mutex
	ends map[string]time.Time
	dead map[string]bool
}

func (l *memLeases) Renew(_ context.Context, _, member string, ttl time.Duration) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.dead[member] {
		return errors.New("crashed")
	}
	l.ends[member] = time.Now().Add(ttl)
	return nil
}

func (l *memLeases) Held(_ context.Context, _ string, members []string) ([]bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	held := make([]bool, len(members))
	for i, m := range members {
		held[i] = time.Now().Before(l.ends[m])
	}
	return held, nil
}

// renewed reports whether member holds its lease.
func (l *memLeases) renewed(member string) bool {
	held, _ := l.Held(context.Background(), "", []string{member})
	return held[0]
}

func (l *memLeases) kill(member string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.dead[member] = true
}

// cuttable dials through net.Dialer until cut, which closes every
// connection it made and fails every later dial: the process is gone as far
// as the broker can tell (no heartbeat, no LeaveGroup).
type cuttable struct {
	mu    sync.Mutex
	conns []net.Conn
	cut   bool
}

func (c *cuttable) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cut {
		return nil, errors.New("cut")
	}
	conn, err := (&net.Dialer{Timeout: time.Second}).DialContext(ctx, network, addr)
	if err == nil {
		c.conns = append(c.conns, conn)
	}
	return conn, err
}

func (c *cuttable) kill() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cut = true
	for _, conn := range c.conns {
		conn.Close()
	}
}

// A member that crashes (its connections cut: no heartbeat, no leave) loses
// its partitions to the survivor within its lease and a heartbeat, not its
// session timeout: the survivor sees the lease end and removes it from the
// group. Without leases the partitions stay with the dead member for the
// whole session timeout (6s here).
func TestKafkaLeaseMovesACrashedMembersPartitions(t *testing.T) {
	broker := testenv.Kafka(t)
	topic, group := createTopic(t, broker), uniqueName(t, "group")
	leases := &memLeases{ends: map[string]time.Time{}, dead: map[string]bool{}}
	const ttl = time.Second

	var mu sync.Mutex
	owned := make([][]int, 2)
	gens := make([]*kafka.Generation, 2)
	crash := &cuttable{}
	for i := range 2 {
		cfg := testConfig(t, broker, group, topic)
		cfg.Leases, cfg.LeaseTTL = leases, ttl
		if i == 1 {
			cfg.Dialer = &kafka.Dialer{Timeout: time.Second, DialFunc: crash.dial}
			cfg.Transport = &kafka.Transport{DialTimeout: time.Second, Dial: crash.dial}
		}
		g, err := NewGroup(cfg, onMessages(func(context.Context, []kafka.Message) error { return nil }))
		if err != nil {
			t.Fatal(err)
		}
		g.m.onGeneration = func(gen *kafka.Generation) {
			var parts []int
			for _, pa := range gen.Assignments[topic] {
				parts = append(parts, pa.ID)
			}
			mu.Lock()
			defer mu.Unlock()
			owned[i], gens[i] = parts, gen
		}
		runInBackground(t, g.Run)
	}
	eventually(t, 30*time.Second, "both members share the partitions for a lease", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return gens[0] != nil && gens[1] != nil && gens[0].ID == gens[1].ID && len(owned[0]) > 0 && len(owned[1]) > 0
	})
	time.Sleep(2 * ttl) // the survivor sees the lease held
	mu.Lock()
	victim := gens[1].MemberID
	mu.Unlock()
	if !leases.renewed(victim) {
		t.Errorf("the member does not hold its lease")
	}

	crashed := time.Now()
	crash.kill()
	leases.kill(victim)
	eventually(t, 30*time.Second, "the survivor owns every partition", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(owned[0]) == testPartitions
	})
	took := time.Since(crashed)
	t.Logf("the survivor owned every partition %v after the crash (lease %v, session timeout %v)", took.Round(time.Millisecond), ttl, testConfig(t, broker, group, topic).SessionTimeout)
	if session := testConfig(t, broker, group, topic).SessionTimeout; took >= session {
		t.Errorf("the crashed member's partitions moved after %v, want within its lease (%v) and a rebalance, well before the session timeout %v", took, ttl, session)
	}
}

// revive lets member renew again.
func (l *memLeases) revive(member string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.dead, member)
}

// A member cut off from Redis but not from Kafka: its heartbeats are
// answered, but its peers remove it once its lease ends, and the next owner
// of its partitions writes as soon as the group has rebalanced. Its fence
// must end before that: within three quarters of a lease after the last
// renewal that went through. A lease never renewed in the generation (Redis
// out of reach since before it began) bounds nothing: no peer saw it held.
func TestWriteFenceEndsWithTheLease(t *testing.T) {
	const ttl = 400 * time.Millisecond
	leases := &memLeases{ends: map[string]time.Time{}, dead: map[string]bool{}}
	m := &member{cfg: Config{Leases: leases, LeaseTTL: ttl}, log: slog.New(slog.DiscardHandler),
		client: &kafka.Client{Addr: kafka.TCP("127.0.0.1:1"), Timeout: 50 * time.Millisecond}}
	var fenced atomic.Int32
	start := func(t *testing.T) *fenceKeeper {
		k := testKeeper(&fakeHeartbeater{}, 10*time.Second, 50*time.Millisecond)
		gctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		go k.run(gctx, make(chan struct{}), slog.New(slog.DiscardHandler), func() { fenced.Add(1) })
		go m.watchLeases(gctx, k.gen, k.fence)
		return k
	}

	t.Run("renewals stop", func(t *testing.T) {
		leases.revive("m")
		k := start(t)
		time.Sleep(3 * ttl)
		if err := k.fence.Err(); err != nil {
			t.Fatalf("with the lease renewed: got %v, want the fence open", err)
		}
		leases.kill("m")
		cut := time.Now()
		select {
		case <-k.fence.Done():
		case <-time.After(5 * ttl):
			t.Fatal("the fence is still open five leases after the renewals stopped, its heartbeats answered")
		}
		if took, most := time.Since(cut), ttl-ttl/4; took > most+100*time.Millisecond {
			t.Errorf("the fence ended %v after the renewals stopped, want within %v of the last one", took, most)
		}
		if err := k.fence.Err(); !errors.Is(err, ErrFenced) || !strings.Contains(err.Error(), "lease") {
			t.Errorf("got %v, want ErrFenced naming the lease", err)
		}
		eventually(t, time.Second, "OnLeaseFenced called", func() bool { return fenced.Load() == 1 })
	})

	t.Run("never renewed in the generation", func(t *testing.T) {
		leases.kill("m")
		k := start(t)
		time.Sleep(4 * ttl)
		if err := k.fence.Err(); err != nil {
			t.Fatalf("a lease not renewed in the generation ended its fence: %v", err)
		}
		leases.revive("m") // Redis back: the lease is held, peers may see it
		time.Sleep(2 * ttl)
		if err := k.fence.Err(); err != nil {
			t.Fatalf("with the lease renewed again: got %v, want the fence open", err)
		}
		leases.kill("m")
		select {
		case <-k.fence.Done():
		case <-time.After(5 * ttl):
			t.Fatal("once renewed in the generation, the lease does not bound the fence")
		}
	})
}
