package main

import (
	"bufio"
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// cmdStats is Redis's own count of calls per command (INFO commandstats),
// which includes the commands that scripts run with redis.call.
type cmdStats map[string]int64

// cmdUsec is the microseconds Redis spent per command (INFO commandstats).
// A script's time includes the commands it ran, which have their own entry too.
type cmdUsec map[string]int64

// busy returns the microseconds Redis spent on the clients' own commands:
// scripts (whose time covers the commands they run) and any command run
// outside one. With scripts present, plain commands are taken to have run
// inside them (true of every mode here).
func (u cmdUsec) busy() int64 {
	var scripts, all int64
	for k, v := range u {
		if ownCommands[k] {
			continue
		}
		all += v
		if strings.HasPrefix(k, "eval") || strings.HasPrefix(k, "fcall") || strings.HasPrefix(k, "script") {
			scripts += v
		}
	}
	if scripts > 0 {
		return scripts
	}
	return all
}

// parseCommandStats reads the output of INFO commandstats: lines such as
// "cmdstat_evalsha:calls=12,usec=345,...".
func parseCommandStats(info string) (cmdStats, cmdUsec, error) {
	out, usec := cmdStats{}, cmdUsec{}
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		name, rest, ok := strings.Cut(line, ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		name = strings.TrimPrefix(name, "cmdstat_")
		for _, kv := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			if k != "calls" && k != "usec" {
				continue
			}
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return nil, nil, fmt.Errorf("commandstats %q: %w", line, err)
			}
			if k == "calls" {
				out[name] = n
			} else {
				usec[name] = n
			}
		}
	}
	return out, usec, sc.Err()
}

// ownCommands are the driver's own commands around a measurement (stats,
// keeping the run lock), left out of the counts.
var ownCommands = map[string]bool{"info": true, "config|resetstat": true, "config": true, "getex": true}

// total returns the calls of every command but the driver's own.
func (s cmdStats) total() int64 {
	var n int64
	for k, v := range s {
		if !ownCommands[k] {
			n += v
		}
	}
	return n
}

// top returns the commands with the most calls, as "name=calls" strings.
func (s cmdStats) top(n int) []string {
	type kv struct {
		k string
		v int64
	}
	var all []kv
	for k, v := range s {
		if !ownCommands[k] {
			all = append(all, kv{k, v})
		}
	}
	for i := 1; i < len(all); i++ {
		for j := i; j > 0 && (all[j].v > all[j-1].v || all[j].v == all[j-1].v && all[j].k < all[j-1].k); j-- {
			all[j], all[j-1] = all[j-1], all[j]
		}
	}
	var out []string
	for i := 0; i < len(all) && i < n; i++ {
		out = append(out, fmt.Sprintf("%s=%d", all[i].k, all[i].v))
	}
	return out
}

func resetStats(ctx context.Context, rdb *redis.Client) error {
	return rdb.ConfigResetStat(ctx).Err()
}

func readStats(ctx context.Context, rdb *redis.Client) (cmdStats, cmdUsec, error) {
	info, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, nil, fmt.Errorf("info commandstats: %w", err)
	}
	return parseCommandStats(info)
}

// otherClients returns the number of connections to Redis besides the
// driver's own one.
func otherClients(ctx context.Context, rdb *redis.Client) (int, error) {
	list, err := rdb.ClientList(ctx).Result()
	if err != nil {
		return 0, err
	}
	n := 0
	for _, l := range strings.Split(strings.TrimSpace(list), "\n") {
		if l != "" && !strings.Contains(l, "name=gkbench-driver") {
			n++
		}
	}
	return n, nil
}

// deletePrefix unlinks every key that starts with prefix.
func deletePrefix(ctx context.Context, rdb *redis.Client, prefix string) (int, error) {
	n := 0
	iter := rdb.Scan(ctx, 0, prefix+"*", 5000).Iterator()
	var batch []string
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		err := rdb.Unlink(ctx, batch...).Err()
		n += len(batch)
		batch = batch[:0]
		return err
	}
	for iter.Next(ctx) {
		batch = append(batch, iter.Val())
		if len(batch) == 1000 {
			if err := flush(); err != nil {
				return n, err
			}
		}
	}
	if err := iter.Err(); err != nil {
		return n, err
	}
	return n, flush()
}

// lockKey guards a benchmark run: two runs against the same Redis would
// reset each other's command stats, and against the same Kafka share (and
// delete) each other's data sets.
const lockKey = "gkbench:lock"

// lock takes the run lock in Redis, waiting up to wait for another run to
// finish, and keeps it until the returned function is called.
func lock(ctx context.Context, rdb *redis.Client, id string, wait time.Duration, logf func(string, ...any)) (func(), error) {
	const ttl = 30 * time.Second
	deadline := time.Now().Add(wait)
	for said := false; ; {
		ok, err := rdb.SetNX(ctx, lockKey, id, ttl).Result()
		if err != nil {
			return nil, fmt.Errorf("take the run lock: %w", err)
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			holder, _ := rdb.Get(ctx, lockKey).Result()
			return nil, fmt.Errorf("another benchmark run (%s) holds %s in Redis after %v; wait for it, or delete the key if it is stale", holder, lockKey, wait)
		}
		if !said {
			holder, _ := rdb.Get(ctx, lockKey).Result()
			logf("another benchmark run (%s) is using this Redis and Kafka; waiting for it to finish", holder)
			said = true
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(ttl / 3)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				// GETEX, which no mode uses, so that it can be left out of the counts.
				_ = rdb.GetEx(context.WithoutCancel(ctx), lockKey, ttl).Err()
			}
		}
	}()
	return func() {
		close(done)
		<-stopped
		c := context.WithoutCancel(ctx)
		if v, _ := rdb.Get(c, lockKey).Result(); v == id {
			_ = rdb.Del(c, lockKey).Err()
		}
	}, nil
}
