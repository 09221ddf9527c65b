//go:build fault

package fault

import (
	"context"
	"crypto/rand"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/gatekeeper-dev/gatekeeper/internal/testenv"
)

// The setting every scenario shares.
const (
	sourcePartitions = 6
	tierPartitions   = 3 // of downstream, dead letter and each retry tier
	retryPartitions  = 3 * tierPartitions
	limitPerWindow   = 50
	window           = 5 * time.Second
	limits           = "*=50/5s"
	batchSize        = 100
	shutdownGrace    = 15 * time.Second
	// sessionTimeout lets a killed member's partitions move in seconds (as in
	// integration/kill_test.go).
	sessionTimeout = 8 * time.Second
	// loadDuration is how long the producer writes. The hottest tenant
	// builds a backlog of deferred events that takes 1.3 times as long to
	// drain, so a scenario takes about 2.3 times this plus set-up.
	loadDuration = 26 * time.Second
	// monitorEvery is how often the readiness of every gatekeeper is polled.
	monitorEvery = 250 * time.Millisecond
)

// runID makes names unique across runs.
var runID = strings.ToLower(rand.Text()[:6])

// TestRollingUpdate replaces the three replicas one at a time, about ten
// seconds apart, during the load: SIGTERM, wait for the exit, start a
// replacement, wait until it is ready. A graceful handover duplicates
// nothing (G8).
func TestRollingUpdate(t *testing.T) {
	runScenario(t, scenario{name: "rolling-update", replicas: 3, load: loadDuration, exact: true,
		capacity: fmt.Sprintf("%d/1s", capacityPerSecond),
		fault: func(r *run) dupParams {
			for i := range 3 {
				r.sleepUntil(1500*time.Millisecond + time.Duration(i)*10*time.Second)
				old := r.fleet.procs()[0] // the oldest
				r.mark("replace " + old.Name)
				r.fleet.terminate(r.t, shutdownGrace, old)
				p := r.fleet.start(r.t)
				p.WaitReady(r.t, 90*time.Second)
				r.t.Logf("fault: %s replaced by %s (ready at +%v)", old.Name, p.Name, r.since())
			}
			return dupParams{BatchSize: batchSize}
		}})
}

// TestScaling starts with one replica, adds two, and later stops two with
// SIGTERM at once. Scaling is a graceful handover: no duplicates (G8).
func TestScaling(t *testing.T) {
	runScenario(t, scenario{name: "scaling", replicas: 1, load: loadDuration, exact: true,
		fault: func(r *run) dupParams {
			r.sleepUntil(5 * time.Second)
			r.mark("scale 1->3")
			ps := []*testenv.Process{r.fleet.start(r.t), r.fleet.start(r.t)}
			for _, p := range ps {
				p.WaitReady(r.t, 90*time.Second)
			}
			r.t.Logf("fault: %s and %s ready at +%v", ps[0].Name, ps[1].Name, r.since())
			r.sleepUntil(16 * time.Second)
			r.mark("scale 3->1")
			live := r.fleet.procs()
			r.fleet.terminate(r.t, shutdownGrace, live[0], live[1])
			r.t.Logf("fault: %s keeps running alone (+%v)", r.fleet.procs()[0].Name, r.since())
			return dupParams{BatchSize: batchSize}
		}})
}

// TestSigkill kills one of three replicas with SIGKILL mid-load (no drain,
// no commit, no leave) and starts it again three seconds later. A crash may
// redeliver what was acknowledged since the last commit (G1, G8): the
// duplicates are bounded by dupBound.
func TestSigkill(t *testing.T) {
	runScenario(t, scenario{name: "sigkill", replicas: 3, load: loadDuration,
		fault: func(r *run) dupParams {
			r.sleepUntil(8 * time.Second)
			victim := r.fleet.procs()[1]
			src, ok1 := victim.LastGeneration(r.flow.Group)
			retry, ok2 := victim.LastGeneration(r.flow.RetryGroup())
			if !ok1 || !ok2 {
				r.t.Fatalf("%s logged no generation of %s and %s", victim.Name, r.flow.Group, r.flow.RetryGroup())
			}
			r.mark("SIGKILL " + victim.Name)
			r.fleet.kill(victim)
			r.t.Logf("fault: %s killed; it owned %v and %v", victim.Name, src.Partitions, retry.Partitions)
			time.Sleep(3 * time.Second)
			p := r.fleet.start(r.t)
			p.WaitReady(r.t, 90*time.Second)
			r.t.Logf("fault: %s started in its place, ready at +%v", p.Name, r.since())
			return dupParams{SourceOwned: len(src.Partitions), RetryOwned: len(retry.Partitions), BatchSize: batchSize}
		}})
}

// TestRedisFreeze freezes Redis for four seconds (DEBUG SLEEP 4, from a
// connection of its own) mid-load, two seconds into a window, so that calls
// made in one window are answered in the next. Consumption pauses and
// resumes by itself (G6) and nothing is duplicated or forwarded over the
// limit. The report compares the Redis window counts with the decisions
// seen (G9: a call retried after its timeout must not count twice).
func TestRedisFreeze(t *testing.T) {
	runScenario(t, scenario{name: "redis-freeze", replicas: 3, load: loadDuration, exact: true,
		fault: func(r *run) dupParams {
			r.sleepUntil(12 * time.Second)
			rdb := redis.NewClient(&redis.Options{Addr: redisAddr(), ReadTimeout: 15 * time.Second, MaxRetries: -1})
			defer rdb.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			r.mark("redis DEBUG SLEEP 4")
			if err := rdb.Do(ctx, "DEBUG", "SLEEP", "4").Err(); err != nil {
				r.t.Fatalf("DEBUG SLEEP 4: %v", err)
			}
			r.t.Logf("fault: redis answers again (+%v)", r.since())
			return dupParams{BatchSize: batchSize}
		}})
}

// TestBrokerRestart stops the Kafka broker (kafka.sh stop) mid-load and
// starts it again on the same data. Every member loses its group at once;
// the duplicates are bounded by dupBound over all partitions.
func TestBrokerRestart(t *testing.T) {
	runScenario(t, scenario{name: "broker-restart", replicas: 3, load: loadDuration + 10*time.Second,
		fault: func(r *run) dupParams {
			r.sleepUntil(6 * time.Second)
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			defer cancel()
			r.mark("kafka stop+start")
			if out, err := servers.broker.script(ctx, "stop"); err != nil {
				r.t.Fatalf("%v\n%s", err, out)
			}
			r.t.Logf("fault: broker stopped (+%v)", r.since())
			if out, err := servers.broker.script(ctx, "start"); err != nil {
				r.t.Fatalf("%v\n%s", err, out)
			}
			r.t.Logf("fault: broker serving again (+%v)", r.since())
			return dupParams{SourceOwned: sourcePartitions, RetryOwned: retryPartitions, BatchSize: batchSize}
		}})
}

// dupParams is what dupBound needs to know of a fault.
type dupParams struct {
	// SourceOwned and RetryOwned are the source and retry-tier partitions
	// whose owner failed: the killed replica's, or all of them when the
	// broker restarts.
	SourceOwned, RetryOwned int
	// BatchSize is GATEKEEPER_BATCH_SIZE.
	BatchSize int
}

// dupBound returns the most duplicates (downstream plus dead letter, beyond
// the source's copies) a scenario may produce.
//
// A graceful handover (rolling update, scaling) and a Redis freeze must not
// duplicate anything (G8): 0. A crash redelivers at most what was
// acknowledged since the partition's last commit (G8, README "Delivery"):
// on a source partition the batch being handled and the one whose commit
// was in flight (2 x GATEKEEPER_BATCH_SIZE: the source group commits a batch
// while it handles the next), on a retry-tier partition the batch being
// handled (1 x GATEKEEPER_BATCH_SIZE: the retry group commits after each
// batch, with its done set). So for SIGKILL: the killed replica's source
// partitions x 2 x batch plus its retry-tier partitions x batch; for the
// broker restart, where every member loses its group coordinator at once:
// all partitions (6 source, 9 retry) the same way.
func dupBound(scenario string, p dupParams) int {
	switch scenario {
	case "sigkill", "broker-restart":
		return (2*p.SourceOwned + p.RetryOwned) * p.BatchSize
	default:
		return 0
	}
}

// scenario is one fault scenario.
type scenario struct {
	name     string
	replicas int           // at the start
	load     time.Duration // how long the producer writes
	// exact asserts duplicated == 0 and max_window <= the limit; otherwise
	// duplicated <= dupBound (copies may then legitimately fill a window
	// beyond the limit, so max_window is only reported).
	exact bool
	// fault runs in the test goroutine while the load runs; it calls
	// r.mark at the start of each fault and returns what dupBound needs.
	fault func(r *run) dupParams
	// capacity, when set, is GATEKEEPER_CAPACITY of the fleet, and every
	// window of it is checked to hold at most its limit (G12).
	capacity string
}
