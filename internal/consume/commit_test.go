package consume

import (
	"errors"
	"runtime"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// Offsets handed in while a commit is in flight go together in the next
// request, the latest per partition; every caller gets its request's error,
// or its partition's own error.
func TestOffsetCommitterCoalesces(t *testing.T) {
	var (
		mu       sync.Mutex
		requests []map[tp]offsetCommit
	)
	release := make(chan struct{})
	started := make(chan struct{}, 10)
	boom, refused := errors.New("boom"), errors.New("refused")
	oc := &offsetCommitter{send: func(offs map[tp]offsetCommit) (map[tp]error, error) {
		mu.Lock()
		requests = append(requests, offs)
		n := len(requests)
		mu.Unlock()
		started <- struct{}{}
		<-release
		switch n {
		case 2:
			return map[tp]error{{"b", 3}: refused}, nil
		case 3:
			return nil, boom
		}
		return nil, nil
	}}
	first := make(chan error, 1)
	go func() { first <- oc.commit("a", 0, offsetCommit{next: 10}) }()
	<-started // the first request is in flight

	var wg sync.WaitGroup
	queue := func(calls []struct {
		topic string
		part  int
		c     offsetCommit
	}) []error {
		errs := make([]error, len(calls))
		for i, c := range calls {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = oc.commit(c.topic, c.part, c.c)
			}()
			// One after another, as a partition's commits come.
			for {
				oc.mu.Lock()
				n := 0
				for _, ws := range oc.waiters {
					n += len(ws)
				}
				oc.mu.Unlock()
				if n == i+1 {
					break
				}
				runtime.Gosched()
			}
		}
		return errs
	}
	errs := queue([]struct {
		topic string
		part  int
		c     offsetCommit
	}{
		{"a", 0, offsetCommit{next: 15, meta: "x"}},
		{"a", 0, offsetCommit{next: 20, meta: "y"}},
		{"a", 0, offsetCommit{next: 20, meta: "z"}}, // same offset, more done: wins
		{"a", 1, offsetCommit{next: 7}},
		{"b", 3, offsetCommit{next: 1}},
	})
	close(release)
	if err := <-first; err != nil {
		t.Errorf("first commit: %v", err)
	}
	wg.Wait()
	for i, err := range errs {
		want := error(nil)
		if i == 4 {
			want = refused
		}
		if !errors.Is(err, want) || (want == nil && err != nil) {
			t.Errorf("commit %d: err = %v, want %v", i, err, want)
		}
	}
	if err := oc.commit("a", 0, offsetCommit{next: 21}); !errors.Is(err, boom) {
		t.Errorf("third request: err = %v, want %v", err, boom)
	}
	want := []map[tp]offsetCommit{
		{{"a", 0}: {next: 10}},
		{{"a", 0}: {next: 20, meta: "z"}, {"a", 1}: {next: 7}, {"b", 3}: {next: 1}},
		{{"a", 0}: {next: 21}},
	}
	if diff := cmp.Diff(want, requests, cmp.AllowUnexported(tp{}, offsetCommit{})); diff != "" {
		t.Errorf("requests (-want +got):\n%s", diff)
	}
}
