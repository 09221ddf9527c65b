package consume

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"
	"unsafe"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	fetchAPI "github.com/segmentio/kafka-go/protocol/fetch"
)

// pagedBroker answers every Fetch with the next per records of an endless
// partition whose record at offset o has the value "v<o>".
type pagedBroker struct{ per int }

func (b pagedBroker) RoundTrip(_ context.Context, _ net.Addr, req protocol.Message) (protocol.Message, error) {
	r, ok := req.(*fetchAPI.Request)
	if !ok {
		return nil, fmt.Errorf("unexpected request %T", req)
	}
	from := r.Topics[0].Partitions[0].FetchOffset
	recs := make([]protocol.Record, b.per)
	for i := range recs {
		o := from + int64(i)
		recs[i] = protocol.Record{Offset: o, Time: time.UnixMilli(o), Value: protocol.NewBytes(fmt.Appendf(nil, "v%d", o)),
			Headers: []protocol.Header{{Key: "h", Value: fmt.Appendf(nil, "%d", o)}}}
	}
	return &fetchAPI.Response{Topics: []fetchAPI.ResponseTopic{{Topic: "t", Partitions: []fetchAPI.ResponsePartition{{
		HighWatermark: 1 << 40,
		RecordSet:     protocol.RecordSet{Version: 2, Records: protocol.NewRecordReader(recs...)},
	}}}}}, nil
}

// TestCommittedFetcherReusesItsBuffer: each response is decoded into the
// same array (one response of thousands of records no longer grows a new
// slice each time), and what was handed out from the last one is intact.
func TestCommittedFetcherReusesItsBuffer(t *testing.T) {
	const per = 1000
	cfg := &Config{Transport: pagedBroker{per: per}, MaxBytes: 1 << 20, FetchMaxWait: 2 * time.Second, Timeout: time.Second}
	f := newCommittedFetcher(cfg, &kafka.Client{}, "t", 0, 0)
	defer f.Close()
	ctx := context.Background()
	var arrays []*kafka.Message
	var kept []kafka.Message
	for o := range int64(3 * per) {
		m, err := f.FetchMessage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if m.Offset != o || string(m.Value) != fmt.Sprint("v", o) {
			t.Fatalf("got offset %d value %q, want %d and v%d", m.Offset, m.Value, o, o)
		}
		if o%per == 0 { // the first of a response: f.buf starts one past the array's start
			arrays = append(arrays, unsafe.SliceData(f.buf))
		}
		kept = append(kept, m)
	}
	for i, a := range arrays[1:] {
		if a != arrays[0] {
			t.Errorf("response %d decoded into a new array", i+2)
		}
	}
	for o, m := range kept {
		if m.Offset != int64(o) || string(m.Value) != fmt.Sprint("v", o) ||
			len(m.Headers) != 1 || m.Headers[0].Key != "h" || string(m.Headers[0].Value) != fmt.Sprint(o) {
			t.Fatalf("kept message %d changed: offset %d value %q headers %v", o, m.Offset, m.Value, m.Headers)
		}
	}
}

func TestReadKeyValue(t *testing.T) {
	for _, tt := range []struct {
		name       string
		key, value []byte
	}{
		{"both", []byte("tenant"), []byte(`{"a":1}`)},
		{"no key", nil, []byte("v")},
		{"no value", []byte("k"), nil},
		{"empty key", []byte{}, []byte("v")},
		{"neither", nil, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := &protocol.Record{Key: protocol.NewBytes(tt.key), Value: protocol.NewBytes(tt.value)}
			key, value, err := readKeyValue(r)
			if err != nil {
				t.Fatal(err)
			}
			if (key == nil) != (tt.key == nil) || string(key) != string(tt.key) {
				t.Errorf("key: got %q (nil %t), want %q (nil %t)", key, key == nil, tt.key, tt.key == nil)
			}
			if (value == nil) != (tt.value == nil) || string(value) != string(tt.value) {
				t.Errorf("value: got %q (nil %t), want %q (nil %t)", value, value == nil, tt.value, tt.value == nil)
			}
			// The two share one allocation: appending to the key must not
			// write into the value.
			_ = append(key, "XXXXXXXX"...)
			if string(value) != string(tt.value) {
				t.Errorf("value after appending to the key: got %q, want %q", value, tt.value)
			}
		})
	}
}
