package consume

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	fetchAPI "github.com/segmentio/kafka-go/protocol/fetch"
)

// committedFetcher reads one partition with read_committed isolation: it
// returns the records of committed transactions and of producers that use
// none, in offset order, never a record of an aborted transaction, never a
// record of a transaction still open (the broker serves only up to the last
// stable offset), and never a transaction marker.
//
// kafka-go's Reader cannot do this: with IsolationLevel ReadCommitted it
// stops at the last stable offset, but it returns the records of aborted
// transactions and the markers too, because the client must drop them itself
// from the aborted-transaction list of each fetch response, which kafka-go
// reads past. committedFetcher sends the Fetch requests itself and drops
// them as Kafka's own consumer does.
//
// It holds at most one fetch response, of at most maxBytes bytes (the broker
// may exceed it by one record batch, to make progress), decoded: there is no
// queue beyond it. A fetch starts only when the previous response has been
// handed out. It runs in a goroutine of its own, so that a caller that stops
// waiting (a batch's wait ended) does not cut it off: its response is kept
// for the next call, and the connection stays open.
//
// A committedFetcher is used by one goroutine at a time; Close it when done.
type committedFetcher struct {
	transport kafka.RoundTripper
	addr      net.Addr
	client    *kafka.Client
	topic     string
	partition int
	maxBytes  int
	maxWait   time.Duration // the socket deadline; the broker waits less
	timeout   time.Duration // bound of ListOffsets

	// offset, buf and store, and recheck and verified below, are written by
	// the fetch goroutine while pending is set, and by the caller otherwise.
	offset int64           // the next offset to hand out; negative: kafka.FirstOffset or kafka.LastOffset
	buf    []kafka.Message // decoded and not handed out yet, in offset order
	// store is buf's backing array, reused by every fill: a response of
	// thousands of records would otherwise grow a new slice each time
	// (a third of the bytes the gating path allocated). FetchMessage
	// zeroes what it hands out, so store keeps no record alive.
	store   []kafka.Message
	pending chan error      // the result of the fetch in flight, nil when none
	life    context.Context // ends at Close
	close   context.CancelFunc

	// verify, if set, reads the topic's ID again and returns an error
	// unless it is still the one assigned (errTopicReplaced when it is
	// another; topicid.go). Every fetch that returns records runs it, while
	// they are decoded, and hands none of them out unless it returns nil;
	// every fetch that fails on the partition runs it too, and so does the
	// first fetch without records after one failed (the topic created again
	// may be no longer than the old offset) or topicRecheck after the last
	// check.
	verify func(ctx context.Context) error
	// recheck: a fetch failed on the partition since verify last passed;
	// verified: when it last passed. A fetch without records runs verify
	// when recheck, or when verified lies topicRecheck back.
	recheck  bool
	verified time.Time
}

// newCommittedFetcher returns a fetcher of topic's partition starting at
// offset (a committed offset, or kafka.FirstOffset or kafka.LastOffset).
func newCommittedFetcher(cfg *Config, client *kafka.Client, topic string, partition int, offset int64) *committedFetcher {
	life, cancel := context.WithCancel(context.Background())
	return &committedFetcher{
		life:      life,
		close:     cancel,
		transport: cfg.Transport,
		addr:      client.Addr,
		client:    client,
		topic:     topic,
		partition: partition,
		maxBytes:  cfg.MaxBytes,
		maxWait:   cfg.FetchMaxWait,
		timeout:   cfg.Timeout,
		offset:    offset,
	}
}

// FetchMessage returns the next committed record of the partition, waiting
// until there is one or ctx is done. A record is handed out once: when ctx
// ends during a fetch, nothing is lost, the next call fetches again.
func (f *committedFetcher) FetchMessage(ctx context.Context) (kafka.Message, error) {
	for f.pending != nil || len(f.buf) == 0 { // f.buf is the fetch goroutine's while pending
		if f.pending == nil {
			if err := ctx.Err(); err != nil {
				return kafka.Message{}, err
			}
			f.prefetch()
		}
		select {
		case err := <-f.pending:
			f.pending = nil
			if err != nil {
				return kafka.Message{}, err
			}
		case <-ctx.Done():
			return kafka.Message{}, ctx.Err()
		}
	}
	m := f.buf[0]
	f.buf[0] = kafka.Message{}
	f.buf = f.buf[1:]
	f.offset = m.Offset + 1
	return m, nil
}

// prefetch sends the next fetch, if none is in flight and nothing fetched
// is left, without waiting for it: the next FetchMessage takes its answer.
func (f *committedFetcher) prefetch() {
	if f.pending != nil || len(f.buf) > 0 {
		return
	}
	ch := make(chan error, 1)
	f.pending = ch
	go func() { ch <- f.fill(f.life) }()
}

// seek makes the next FetchMessage start at offset: the fetch in flight,
// if any, is stopped and what is fetched and not handed out is dropped.
func (f *committedFetcher) seek(offset int64) {
	if f.pending != nil {
		f.close()
		<-f.pending
		f.pending = nil
		f.life, f.close = context.WithCancel(context.Background())
	}
	clear(f.buf)
	f.buf = f.buf[:0]
	f.offset = offset
}

// Close stops the fetch in flight, if any, and waits for it.
func (f *committedFetcher) Close() error {
	f.close()
	if f.pending != nil {
		<-f.pending
		f.pending = nil
	}
	return nil
}

// brokerWait is how long the broker may hold a fetch without data: the
// socket deadline maxWait minus slack for the reply (1s, or a quarter of
// it when maxWait is 1s or less), as kafka-go's Reader did.
func (f *committedFetcher) brokerWait() time.Duration {
	if f.maxWait > time.Second {
		return f.maxWait - time.Second
	}
	return f.maxWait * 3 / 4
}

// fill sends one Fetch from f.offset and decodes what it returns into f.buf
// (possibly nothing: no committed record yet, or only aborted ones and
// markers, in which case f.offset moves past them).
func (f *committedFetcher) fill(ctx context.Context) error {
	if f.offset < 0 {
		if err := f.resolve(ctx, f.offset == kafka.FirstOffset); err != nil {
			return err
		}
	}
	fctx, cancel := context.WithTimeout(ctx, f.maxWait+f.timeout)
	defer cancel()
	f.buf = f.store[:0] // fill runs only once buf is all handed out
	defer func() { f.store = f.buf[:0] }()
	wait := f.brokerWait()
	res, err := f.transport.RoundTrip(fctx, f.addr, &fetchAPI.Request{
		ReplicaID:      -1,
		MaxWaitTime:    int32(wait.Milliseconds()),
		MinBytes:       1,
		MaxBytes:       int32(f.maxBytes),
		IsolationLevel: int8(kafka.ReadCommitted),
		SessionID:      -1,
		SessionEpoch:   -1,
		Topics: []fetchAPI.RequestTopic{{
			Topic: f.topic,
			Partitions: []fetchAPI.RequestPartition{{
				Partition:          int32(f.partition),
				CurrentLeaderEpoch: -1,
				FetchOffset:        f.offset,
				LogStartOffset:     -1,
				PartitionMaxBytes:  int32(f.maxBytes),
			}},
		}},
	})
	if err != nil {
		return fmt.Errorf("fetch %s/%d at %d: %w", f.topic, f.partition, f.offset, err)
	}
	r, ok := res.(*fetchAPI.Response)
	if !ok {
		return fmt.Errorf("fetch %s/%d: unexpected response %T", f.topic, f.partition, res)
	}
	if r.ErrorCode != 0 {
		return fmt.Errorf("fetch %s/%d at %d: %w", f.topic, f.partition, f.offset, kafka.Error(r.ErrorCode))
	}
	if len(r.Topics) != 1 || len(r.Topics[0].Partitions) != 1 {
		return fmt.Errorf("fetch %s/%d: response for %d topics, want 1 partition", f.topic, f.partition, len(r.Topics))
	}
	p := &r.Topics[0].Partitions[0]
	if p.ErrorCode != 0 {
		if f.verify != nil {
			f.recheck = true
			// A deleted topic fails the fetch; one created again under
			// the same name then fails it at the old offsets (out of
			// range, or not led yet) until it grows past them.
			if verr := f.verify(ctx); errors.Is(verr, errTopicReplaced) {
				return fmt.Errorf("fetch %s/%d at %d: %w", f.topic, f.partition, f.offset, verr)
			}
		}
		err := kafka.Error(p.ErrorCode)
		if errors.Is(err, kafka.OffsetOutOfRange) {
			return f.outOfRange(ctx)
		}
		return fmt.Errorf("fetch %s/%d at %d: %w", f.topic, f.partition, f.offset, err)
	}
	if p.RecordSet.Records == nil {
		if f.verify != nil && (f.recheck || time.Since(f.verified) > topicRecheck) {
			if err := f.checkTopic(ctx); err != nil {
				return fmt.Errorf("fetch %s/%d at %d: %w", f.topic, f.partition, f.offset, err)
			}
		}
		return nil // nothing committed beyond f.offset yet
	}
	var verified chan error
	if f.verify != nil {
		verified = make(chan error, 1)
		go func() { verified <- f.checkTopic(ctx) }()
	}
	next, err := f.decode(p.RecordSet.Records, p.AbortedTransactions, p.HighWatermark)
	if verified != nil {
		if verr := <-verified; verr != nil {
			clear(f.buf)
			f.buf = f.buf[:0]
			return fmt.Errorf("fetch %s/%d at %d: %w", f.topic, f.partition, f.offset, verr)
		}
	}
	if err != nil {
		return fmt.Errorf("fetch %s/%d at %d: %w", f.topic, f.partition, f.offset, err)
	}
	switch {
	case len(f.buf) > 0:
	case next > f.offset:
		f.offset = next // only markers and aborted records: move past them
	default:
		// Records, all before f.offset: the end of a compacted batch, whose
		// last offsets hold no record (kafka-go's decoder does not keep the
		// batch's last offset). Step over one offset per fetch.
		f.offset++
	}
	return nil
}

// checkTopic runs verify and notes when it passed.
func (f *committedFetcher) checkTopic(ctx context.Context) error {
	if err := f.verify(ctx); err != nil {
		return err
	}
	f.recheck, f.verified = false, time.Now()
	return nil
}

// decode appends the committed records of rr at or after f.offset to f.buf
// and returns the offset after the last record or marker it read. Records of
// a producer's transaction whose first offset is in aborted are dropped up to
// that producer's abort marker, as Kafka's consumer does.
func (f *committedFetcher) decode(rr protocol.RecordReader, aborted []fetchAPI.ResponseTransaction, hwm int64) (int64, error) {
	aborted = slices.Clone(aborted)
	slices.SortFunc(aborted, func(a, b fetchAPI.ResponseTransaction) int { return cmp.Compare(a.FirstOffset, b.FirstOffset) })
	abortedProducers := map[int64]bool{}
	next := f.offset
	var batches []protocol.RecordReader
	if s, ok := rr.(*protocol.RecordStream); ok {
		batches = s.Records
	} else {
		batches = []protocol.RecordReader{rr}
	}
	for _, b := range batches {
		switch b := b.(type) {
		case *protocol.ControlBatch:
			for {
				cr, err := b.ReadControlRecord()
				if err != nil {
					break
				}
				next = max(next, cr.Offset+1)
				if cr.Type == 0 { // ABORT: this producer's aborted transaction ends here
					delete(abortedProducers, b.ProducerID)
				}
			}
		case *protocol.RecordBatch:
			for len(aborted) > 0 && aborted[0].FirstOffset <= b.BaseOffset {
				abortedProducers[aborted[0].ProducerID] = true
				aborted = aborted[1:]
			}
			skip := b.Attributes.Transactional() && abortedProducers[b.ProducerID]
			n, err := f.readRecords(b, skip, hwm)
			next = max(next, n)
			if err != nil {
				return next, err
			}
		default:
			n, err := f.readRecords(b, false, hwm)
			next = max(next, n)
			if err != nil {
				return next, err
			}
		}
	}
	return next, nil
}

// readRecords appends the records of one batch at or after f.offset to
// f.buf, unless skip, and returns the offset after the last one read.
func (f *committedFetcher) readRecords(b protocol.RecordReader, skip bool, hwm int64) (int64, error) {
	next := int64(-1)
	for {
		r, err := b.ReadRecord()
		if errors.Is(err, io.EOF) {
			return next, nil
		}
		if err != nil {
			return next, err
		}
		next = r.Offset + 1
		if skip || r.Offset < f.offset {
			closeBytes(r)
			continue
		}
		key, value, err := readKeyValue(r)
		closeBytes(r)
		if err != nil {
			return next, err
		}
		// kafka.Header is protocol.Header, and the decoder makes each
		// record's header slice afresh: it is the message's own, not copied.
		var headers []kafka.Header
		if n := len(r.Headers); n > 0 {
			headers = r.Headers[:n:n]
		}
		f.buf = append(f.buf, kafka.Message{
			Topic: f.topic, Partition: f.partition, Offset: r.Offset, HighWaterMark: hwm,
			Key: key, Value: value, Headers: headers, Time: r.Time,
		})
	}
}

// readKeyValue reads r's key and value into one allocation (one per event
// rather than two), each capped so that appending to one never writes into
// the other. An absent key or value stays nil, as protocol.ReadAll has it.
func readKeyValue(r *protocol.Record) (key, value []byte, err error) {
	kn, vn := 0, 0
	if r.Key != nil {
		kn = r.Key.Len()
	}
	if r.Value != nil {
		vn = r.Value.Len()
	}
	buf := make([]byte, kn+vn)
	if r.Key != nil {
		key = buf[:kn:kn]
		if _, err := io.ReadFull(r.Key, key); err != nil {
			return nil, nil, fmt.Errorf("record %d key: %w", r.Offset, err)
		}
	}
	if r.Value != nil {
		value = buf[kn:]
		if _, err := io.ReadFull(r.Value, value); err != nil {
			return nil, nil, fmt.Errorf("record %d value: %w", r.Offset, err)
		}
	}
	return key, value, nil
}

func closeBytes(r *protocol.Record) {
	if r.Key != nil {
		r.Key.Close()
	}
	if r.Value != nil {
		r.Value.Close()
	}
}

// outOfRange handles OffsetOutOfRange: an offset below the log start
// (events deleted by retention before they were consumed) moves to the log
// start, which the gap check then reports; an offset past the end is an
// error, retried after a backoff.
func (f *committedFetcher) outOfRange(ctx context.Context) error {
	first, last, err := f.bounds(ctx)
	if err != nil {
		return fmt.Errorf("fetch %s/%d at %d: offset out of range, and %w", f.topic, f.partition, f.offset, err)
	}
	if f.offset < first {
		f.offset = first
		return nil
	}
	return fmt.Errorf("fetch %s/%d at %d: %w (log %d to %d)", f.topic, f.partition, f.offset, kafka.OffsetOutOfRange, first, last)
}

// resolve sets f.offset to the partition's first (or else last) offset.
func (f *committedFetcher) resolve(ctx context.Context, first bool) error {
	lo, hi, err := f.bounds(ctx)
	if err != nil {
		return fmt.Errorf("fetch %s/%d: %w", f.topic, f.partition, err)
	}
	f.offset = hi
	if first {
		f.offset = lo
	}
	return nil
}

// bounds returns the partition's log start offset and its last stable offset.
func (f *committedFetcher) bounds(ctx context.Context) (first, last int64, err error) {
	lctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	res, err := f.client.ListOffsets(lctx, &kafka.ListOffsetsRequest{
		Topics:         map[string][]kafka.OffsetRequest{f.topic: {kafka.FirstOffsetOf(f.partition), kafka.LastOffsetOf(f.partition)}},
		IsolationLevel: kafka.ReadCommitted,
	})
	if err != nil {
		return 0, 0, fmt.Errorf("list offsets: %w", err)
	}
	for _, po := range res.Topics[f.topic] {
		if po.Partition == f.partition {
			if po.Error != nil {
				return 0, 0, fmt.Errorf("list offsets: %w", po.Error)
			}
			return po.FirstOffset, po.LastOffset, nil
		}
	}
	return 0, 0, fmt.Errorf("list offsets: %w", kafka.UnknownTopicOrPartition)
}
