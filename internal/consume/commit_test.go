package consume

import (
	"errors"
	"runtime"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// Offsets handed in while a commit is in flight go together in the next
// request, the highest per partition; every caller gets its request's error.
func TestOffsetCommitterCoalesces(t *testing.T) {
	var (
		mu       sync.Mutex
		requests []map[string]map[int]int64
	)
	release := make(chan struct{})
	started := make(chan struct{}, 10)
	boom := errors.New("boom")
	oc := &offsetCommitter{send: func(offs map[string]map[int]int64) error {
		mu.Lock()
		requests = append(requests, offs)
		n := len(requests)
		mu.Unlock()
		started <- struct{}{}
		<-release
		if n == 2 {
			return boom
		}
		return nil
	}}
	first := make(chan error, 1)
	go func() { first <- oc.commit("a", 0, 10) }()
	<-started // the first request is in flight

	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i, c := range []struct {
		topic string
		part  int
		next  int64
	}{{"a", 0, 20}, {"a", 0, 15}, {"a", 1, 7}, {"b", 3, 1}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = oc.commit(c.topic, c.part, c.next)
		}()
	}
	// Wait until all four are queued behind the first request.
	for {
		oc.mu.Lock()
		n := len(oc.waiters)
		oc.mu.Unlock()
		if n == 4 {
			break
		}
		runtime.Gosched()
	}
	close(release)
	if err := <-first; err != nil {
		t.Errorf("first commit: %v", err)
	}
	wg.Wait()
	for i, err := range errs {
		if !errors.Is(err, boom) {
			t.Errorf("commit %d: err = %v, want the second request's error", i, err)
		}
	}
	want := []map[string]map[int]int64{
		{"a": {0: 10}},
		{"a": {0: 20, 1: 7}, "b": {3: 1}},
	}
	if diff := cmp.Diff(want, requests); diff != "" {
		t.Errorf("requests (-want +got):\n%s", diff)
	}
}
