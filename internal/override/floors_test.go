package override

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
	"github.com/gatekeeper-dev/gatekeeper/internal/testenv"
)

func floorCheck(t *testing.T, capacity, limits string) FloorCheck {
	t.Helper()
	c, err := limit.ParseCapacity(capacity)
	if err != nil {
		t.Fatal(err)
	}
	base, err := limit.ParseRules(limits)
	if err != nil {
		t.Fatal(err)
	}
	return FloorCheck{Capacity: c, Base: base}
}

// floorsRec is a share override of tenant with floor n/1s.
func floorsRec(tenant string, n int) Record {
	return Record{Tenant: tenant, Rules: []string{}, KeepRules: true, Floors: []string{fmt.Sprintf("%d/1s", n)}, Reason: "r", By: "w"}
}

// TestStoreFloorsConcurrentWriters: writers on separate stores (replicas)
// at once, each floor within the capacity alone, never together take the
// floors over it, on a single Redis and a Redis Cluster; the check runs in
// the write's script against the overrides in Redis.
func TestStoreFloorsConcurrentWriters(t *testing.T) {
	single, _ := testenv.Redis(t)
	for _, tc := range []struct {
		name string
		rdb  func(t *testing.T) redis.UniversalClient
	}{
		{"single", func(*testing.T) redis.UniversalClient { return single }},
		{"cluster", func(t *testing.T) redis.UniversalClient { return testenv.RedisCluster(t) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			rdb := tc.rdb(t)
			prefix := fmt.Sprintf("gktest:%d:%s", time.Now().UnixNano(), t.Name())
			fc := floorCheck(t, "100/1s", "*=10/1m;b=floor:20/1s")
			const writers = 16
			stores := make([]*Store, 4)
			for i := range stores {
				s, err := NewStore(ctx, rdb, StoreOptions{Prefix: prefix, Floors: func() FloorCheck { return fc }})
				if err != nil {
					t.Fatal(err)
				}
				stores[i] = s
			}
			for round := range 3 {
				var wg sync.WaitGroup
				var mu sync.Mutex
				var won []string
				start := make(chan struct{})
				for i := range writers {
					wg.Add(1)
					go func() {
						defer wg.Done()
						<-start
						tenant := fmt.Sprintf("t%d-%d", round, i)
						_, err := stores[i%len(stores)].Set(ctx, floorsRec(tenant, 30), 0)
						var fe *FloorsError
						mu.Lock()
						defer mu.Unlock()
						switch {
						case err == nil:
							won = append(won, tenant)
						case errors.As(err, &fe):
							if fe.Sum <= 100 {
								t.Errorf("refused at sum %d, within the capacity", fe.Sum)
							}
						default:
							t.Error(err)
						}
					}()
				}
				close(start)
				wg.Wait()
				// 20 (b's floor of LIMITS) + 2 × 30 fit in 100; a third does not.
				if len(won) != 2 {
					t.Fatalf("round %d: %d writes taken (%v), want 2: 20 + %d × 30 over 100", round, len(won), won, len(won))
				}
				assertFloorSums(t, stores[0], fc, 80)
				for _, tenant := range won {
					rec, err := stores[0].Get(ctx, tenant)
					if err != nil {
						t.Fatal(err)
					}
					if _, err := stores[1].Delete(ctx, tenant, rec.Version, "w", "next round"); err != nil {
						t.Fatal(err)
					}
				}
				assertFloorSums(t, stores[0], fc, 20)
			}
		})
	}
}

// assertFloorSums checks the floors in force as the replicas enforce them
// (LIMITS with every stored override) against want, and that they fit.
func assertFloorSums(t *testing.T, s *Store, fc FloorCheck, want int64) {
	t.Helper()
	recs, _, err := s.List(context.Background(), 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	over := map[string]limit.Overlay{}
	for _, r := range recs {
		o, err := overlayOf(r)
		if err != nil {
			t.Fatal(err)
		}
		over[r.Tenant] = o
	}
	rules := fc.Base.WithOverlays(over, 1)
	var sum int64
	for _, tn := range append(rules.OverlayTenants(), "b") {
		if _, ok := over[tn]; tn == "b" && ok {
			continue
		}
		sum += rules.Share(tn).FloorIn(fc.Capacity[0])
	}
	if sum != want {
		t.Errorf("floors in force sum to %d, want %d", sum, want)
	}
	if err := limit.CheckCapacity(rules, fc.Capacity); err != nil {
		t.Errorf("the stored overrides do not fit the capacity: %v", err)
	}
}

// TestStoreFloorsWayBack: floors over the capacity (written without the
// check, as an older release could) do not block a change that lowers a
// floor; a raise is refused; a delete that gives a tenant back its larger
// floor of LIMITS is checked like a raise; an expired override's floor
// leaves the sums; and the sums are built from the records when missing.
func TestStoreFloorsWayBack(t *testing.T) {
	ctx := context.Background()
	fc := floorCheck(t, "100/1s", "*=10/1m;b=floor:50/1s")
	prefix := fmt.Sprintf("gktest:%d:%s", time.Now().UnixNano(), t.Name())
	unchecked := testStore(t, StoreOptions{Prefix: prefix})
	checked := testStore(t, StoreOptions{Prefix: prefix, Floors: func() FloorCheck { return fc }})
	var fe *FloorsError
	// b's override lowers its floor to 10; x takes 60 (10 + 60 = 70).
	b1, err := checked.Set(ctx, floorsRec("b", 10), 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := checked.Set(ctx, floorsRec("x", 60), 0); err != nil {
		t.Fatal(err)
	}
	// Deleting b's override would give it back 50: 110.
	if _, err := checked.Delete(ctx, "b", b1.Version, "w", "back"); !errors.As(err, &fe) || fe.Sum != 110 {
		t.Fatalf("delete of b's override: %v, want refused at 110", err)
	}
	// Over the capacity without the check: y 40 (10 + 60 + 40 = 110).
	y, err := unchecked.Set(ctx, floorsRec("y", 40), 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := checked.Set(ctx, floorsRec("y", 41), y.Version); !errors.As(err, &fe) || fe.Sum != 111 {
		t.Fatalf("raise while over: %v, want refused at 111", err)
	}
	y2, err := checked.Set(ctx, floorsRec("y", 35), y.Version)
	if err != nil {
		t.Fatalf("lowering while over: %v, want taken", err)
	}
	if _, err := checked.Set(ctx, floorsRec("y", 30), y2.Version); err != nil {
		t.Fatalf("lowering to within: %v", err)
	}
	// A shadow share counts nothing: z's shadow floor 90 is taken.
	sh := floorsRec("z", 90)
	sh.Shadow = true
	if _, err := checked.Set(ctx, sh, 0); err != nil {
		t.Fatalf("shadow floor: %v", err)
	}
	// The sums rebuilt from the records give the same answers: 10 + 60 + 30.
	rdb, _ := testenv.Redis(t)
	if err := rdb.Del(ctx, checked.keys.flr, checked.keys.fsum).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := checked.Set(ctx, floorsRec("w", 1), 0); !errors.As(err, &fe) || fe.Sum != 101 {
		t.Fatalf("after the rebuild: %v, want refused at 101", err)
	}
	if n, _ := rdb.HGet(ctx, checked.keys.fsum, "1s").Int64(); n != 100 {
		t.Fatalf("rebuilt floor sum %d, want 100", n)
	}
	// x's floor expires: 60 leaves the sums.
	clock := time.Now().Add(time.Hour)
	later := testStore(t, StoreOptions{Prefix: prefix, Floors: func() FloorCheck { return fc }, Clock: func() time.Time { return clock }})
	xr, _ := checked.Get(ctx, "x")
	exp := time.Now().Add(time.Minute)
	xe := floorsRec("x", 60)
	xe.Expires = &exp
	if _, err := checked.Set(ctx, xe, xr.Version); err != nil {
		t.Fatal(err)
	}
	if n, err := later.ExpireDue(ctx, 10); err != nil || n != 1 {
		t.Fatalf("expire: %d %v", n, err)
	}
	if _, err := checked.Set(ctx, floorsRec("w", 60), 0); err != nil {
		t.Fatalf("after x expired: %v, want 10 + 30 + 60 taken", err)
	}
}
