package limit_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
)

// A tenant limited to 2 events a minute sends 4 at once: 2 are admitted and
// 2 deferred to the next minute, where their slots are reserved.
func Example() {
	addr := os.Getenv("GATEKEEPER_TEST_REDIS")
	if addr == "" {
		addr = "localhost:6379"
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()

	rules, err := limit.ParseRules("*=100/1m;acme=2/1m")
	if err != nil {
		fmt.Println(err)
		return
	}
	now := time.Date(2026, 11, 30, 10, 0, 30, 0, time.UTC)
	l, err := limit.New(context.Background(), rdb, rules, limit.Options{
		Prefix: fmt.Sprintf("gkexample:%d", time.Now().UnixNano()),
		Clock:  func() time.Time { return now },
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	ds, err := l.Admit(context.Background(), []string{"acme", "acme", "acme", "acme"})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, d := range ds {
		if d.Kind == limit.Defer {
			fmt.Println(d.Kind, "due", d.Due.Format("15:04:05"))
			continue
		}
		fmt.Println(d.Kind)
	}
	us, _ := l.Usage(context.Background(), "acme")
	fmt.Printf("%s: %d of %d, resets %s\n", us[0].Rule, us[0].Count, us[0].Limit, us[0].Reset.Format("15:04:05"))
	// Output:
	// admit
	// admit
	// defer due 10:01:00
	// defer due 10:01:00
	// 2/1m: 2 of 2, resets 10:01:00
}

// A tenant limited to 1 KiB a minute sends events of 600, 300 and 500
// bytes: the first two fit now, the third is deferred; one of 2 KiB could
// never fit and is rejected.
func ExampleLimiter_AdmitCosts() {
	addr := os.Getenv("GATEKEEPER_TEST_REDIS")
	if addr == "" {
		addr = "localhost:6379"
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()

	rules, err := limit.ParseRules("acme=100/1m,1KiB/1m")
	if err != nil {
		fmt.Println(err)
		return
	}
	now := time.Date(2026, 11, 30, 10, 0, 30, 0, time.UTC)
	l, err := limit.New(context.Background(), rdb, rules, limit.Options{
		Prefix: fmt.Sprintf("gkexample:%d", time.Now().UnixNano()),
		Clock:  func() time.Time { return now },
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	costs := []limit.Cost{{Bytes: 600}, {Bytes: 300}, {Bytes: 500}, {Bytes: 2048}}
	ds, err := l.AdmitCosts(context.Background(), []string{"acme", "acme", "acme", "acme"}, costs)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, d := range ds {
		switch d.Kind {
		case limit.Defer:
			fmt.Println(d.Kind, "due", d.Due.Format("15:04:05"))
		case limit.Reject:
			fmt.Println(d.Kind, d.Reason)
		default:
			fmt.Println(d.Kind)
		}
	}
	us, _ := l.Usage(context.Background(), "acme")
	for _, u := range us {
		fmt.Printf("%s: %d of %d %s\n", u.Rule, u.Count, u.Limit, u.Unit)
	}
	// Output:
	// admit
	// admit
	// defer due 10:01:00
	// reject cost of 2048 bytes over the whole limit of rule 1KiB/1m
	// 100/1m: 2 of 100 events
	// 1KiB/1m: 900 of 1024 bytes
}
