package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gatekeeper-dev/gatekeeper/internal/override"
)

// seedOverrides writes d.o.Overrides live overrides for the
// gatekeeper-overrides mode through the override store (each a
// compare-and-set write with its audit entry, as the API makes them), one
// per tenant t-0, t-1, ... with the rule of "*", so that the decisions are
// those of the gatekeeper mode.
func (d *driver) seedOverrides(ctx context.Context, mr modeRun, nm modeNames) error {
	store, err := override.NewStore(ctx, d.rdb, override.StoreOptions{Prefix: nm.base, AuditMax: int64(d.o.Overrides) + 1000})
	if err != nil {
		return err
	}
	rule := fmt.Sprintf("%d/%s", mr.limit, ruleUnit(d.o.WindowLen))
	start := time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(d.o.Overrides) || ctx.Err() != nil {
					return
				}
				rec := override.Record{Tenant: tenantName(uint64(i)), Rules: []string{rule}, Reason: "bench", By: "bench"}
				if _, err := store.Set(ctx, rec, 0); err != nil {
					errs <- fmt.Errorf("seed override %d: %w", i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	logf("[%s] %d overrides written in %v", mr.tag, d.o.Overrides, time.Since(start).Round(time.Millisecond))
	return nil
}
