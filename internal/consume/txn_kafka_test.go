package consume

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/gatekeeper-dev/gatekeeper/internal/testenv"
)

// txnProducer returns a franz-go client producing to partition 0 of topic,
// transactional when txnID is set (kafka-go has no transactional producer).
func txnProducer(t *testing.T, broker, topic, txnID string) *kgo.Client {
	t.Helper()
	opts := []kgo.Opt{
		kgo.SeedBrokers(broker),
		kgo.DefaultProduceTopic(topic),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.RequestTimeoutOverhead(10 * time.Second),
	}
	if txnID != "" {
		opts = append(opts, kgo.TransactionalID(txnID), kgo.TransactionTimeout(60*time.Second))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatalf("franz-go client: %v", err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// produceTxn writes n records "prefix-i" to partition 0 through cl, inside
// its open transaction if it has one.
func produceTxn(t *testing.T, cl *kgo.Client, prefix string, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var recs []*kgo.Record
	for i := range n {
		recs = append(recs, &kgo.Record{Partition: 0, Key: []byte(prefix), Value: fmt.Appendf(nil, "%s-%d", prefix, i)})
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("produce %s: %v", prefix, err)
	}
}

func beginTxn(t *testing.T, cl *kgo.Client) {
	t.Helper()
	if err := cl.BeginTransaction(); err != nil {
		t.Fatalf("begin transaction: %v", err)
	}
}

func endTxn(t *testing.T, cl *kgo.Client, commit kgo.TransactionEndTry) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.EndTransaction(ctx, commit); err != nil {
		t.Fatalf("end transaction (commit %v): %v", commit, err)
	}
}

// valueLog counts the values a handler received.
type valueLog struct {
	mu   sync.Mutex
	seen map[string]int
}

func (v *valueLog) add(msgs []kafka.Message) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, m := range msgs {
		v.seen[string(m.Value)]++
	}
}

// count returns how many distinct values start with prefix and a dash.
func (v *valueLog) count(prefix string) int {
	v.mu.Lock()
	defer v.mu.Unlock()
	n := 0
	for val := range v.seen {
		if strings.HasPrefix(val, prefix+"-") {
			n++
		}
	}
	return n
}

// unexpected lists, sorted, every value seen that starts with none of
// allowed (and a dash) or was seen more than once.
func (v *valueLog) unexpected(allowed ...string) []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	var out []string
	for val, n := range v.seen {
		ok := false
		for _, a := range allowed {
			ok = ok || strings.HasPrefix(val, a+"-")
		}
		if !ok || n > 1 {
			out = append(out, fmt.Sprintf("%q x%d", val, n))
		}
	}
	slices.Sort(out)
	return out
}

// TestKafkaReadCommitted: with a real transactional producer on the same
// partition as plain producers, a Group hands over the records of committed
// transactions once, never those of aborted ones, never those of a
// transaction still open (nor anything written after it) before its commit,
// and never a transaction marker.
func TestKafkaReadCommitted(t *testing.T) {
	broker := testenv.Kafka(t)
	topic, group := createTopic(t, broker), uniqueName(t, "group")
	plain := txnProducer(t, broker, topic, "")
	p1 := txnProducer(t, broker, topic, uniqueName(t, "txn1"))
	p2 := txnProducer(t, broker, topic, uniqueName(t, "txn2"))

	produceTxn(t, plain, "plain", 5)
	beginTxn(t, p1)
	produceTxn(t, p1, "aborted", 20)
	endTxn(t, p1, kgo.TryAbort)
	beginTxn(t, p1)
	produceTxn(t, p1, "committed", 20)
	endTxn(t, p1, kgo.TryCommit)
	// Two transactions left open, interleaved, with plain records after them.
	beginTxn(t, p1)
	produceTxn(t, p1, "open-committed1", 10)
	beginTxn(t, p2)
	produceTxn(t, p2, "open-aborted", 20)
	produceTxn(t, p1, "open-committed2", 10)
	produceTxn(t, plain, "after-open", 5)

	v := &valueLog{seen: map[string]int{}}
	g, err := NewGroup(testConfig(t, broker, group, topic), onMessages(func(_ context.Context, msgs []kafka.Message) error {
		v.add(msgs)
		return nil
	}))
	if err != nil {
		t.Fatalf("NewGroup: %v", err)
	}
	stop := runInBackground(t, g.Run)
	eventually(t, 30*time.Second, "plain and committed records handled", func() bool {
		return v.count("plain") == 5 && v.count("committed") == 20
	})
	// Give the open transactions' records (and those behind them) time to
	// show up, if they were going to: several fetches' worth.
	time.Sleep(3 * time.Second)
	if bad := v.unexpected("plain", "committed"); len(bad) > 0 {
		t.Errorf("while two transactions are open, handled records of aborted or open transactions, markers or duplicates: %v", bad)
	}

	endTxn(t, p1, kgo.TryCommit)
	endTxn(t, p2, kgo.TryAbort)
	eventually(t, 30*time.Second, "records of the committed transaction and after it handled", func() bool {
		return v.count("open-committed1") == 10 && v.count("open-committed2") == 10 && v.count("after-open") == 5
	})
	produceTxn(t, plain, "last", 1) // behind the second abort marker
	eventually(t, 30*time.Second, "the last record handled", func() bool { return v.count("last") == 1 })
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if bad := v.unexpected("plain", "committed", "open-committed1", "open-committed2", "after-open", "last"); len(bad) > 0 {
		t.Errorf("handled records of aborted transactions, markers or duplicates: %v", bad)
	}
}
