package main

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/gatekeeper-dev/gatekeeper/internal/worker"
)

// demoCapacityLine summarises the capacity's windows as Redis holds them:
// how many, the fullest against the capacity, and what each tenant booked
// in all of them (its share).
func demoCapacityLine(ctx context.Context, cfg *worker.Config) string {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	rdb, err := worker.NewRedis(ctx, cfg)
	if err != nil {
		return "capacity: " + err.Error()
	}
	defer rdb.Close()
	c := cfg.CapacityRules()
	if len(c) == 0 {
		return "capacity: none"
	}
	var keys []string
	iter := rdb.Scan(ctx, 0, cfg.RedisKeyPrefix+":cap:"+c[0].Counter()+":*", 1000).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		return "capacity: " + err.Error()
	}
	var fullest, over int64
	booked := map[string]int64{}
	for _, k := range keys {
		h, err := rdb.HGetAll(ctx, k).Result()
		if err != nil {
			return "capacity: " + err.Error()
		}
		n, _ := strconv.ParseInt(h["count"], 10, 64)
		fullest = max(fullest, n)
		if n > c[0].Limit {
			over++
		}
		for f, v := range h {
			if strings.HasPrefix(f, "t:") {
				x, _ := strconv.ParseInt(v, 10, 64)
				booked[f[2:]] += x
			}
		}
	}
	names := make([]string, 0, len(booked))
	for t := range booked {
		names = append(names, t)
	}
	sort.Strings(names)
	parts := make([]string, len(names))
	for i, t := range names {
		parts[i] = fmt.Sprintf("%s %d", t, booked[t])
	}
	return fmt.Sprintf("capacity %s: %d windows, the fullest %d, over the capacity %d; booked per tenant: %s",
		c[0], len(keys), fullest, over, strings.Join(parts, ", "))
}
