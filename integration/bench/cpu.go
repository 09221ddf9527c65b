package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// The CPU accounting of a mode: everything that runs on the machine's cores
// for it (the mode's process, Kafka's broker, Redis), so that a mode's cost
// can be read as one sum, not only as its own process's share.

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat times: 100 on every
// Linux architecture Go supports.
const clockTicks = 100

// procCPU returns the CPU seconds (user + system) process pid has used.
func procCPU(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the command name, which is in parentheses and may hold
	// spaces: state is field 3, utime 14, stime 15.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: utime %q stime %q", pid, f[11], f[12])
	}
	return float64(utime+stime) / clockTicks, nil
}

// pidFromFile reads a pid file; ok is false when there is none or its
// process is gone (Kafka not started by deploy/local, or remote).
func pidFromFile(path string) (int, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, false
	}
	if _, err := procCPU(pid); err != nil {
		return 0, false
	}
	return pid, true
}

// redisCPU returns the CPU seconds the Redis server has used (INFO cpu:
// used_cpu_sys + used_cpu_user, main thread and all).
func redisCPU(ctx context.Context, rdb *redis.Client) (float64, error) {
	info, err := rdb.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, fmt.Errorf("info cpu: %w", err)
	}
	var sum float64
	var found int
	for _, l := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(l), ":")
		if ok && (k == "used_cpu_sys" || k == "used_cpu_user") {
			x, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return 0, fmt.Errorf("info cpu: %s %q", k, v)
			}
			sum += x
			found++
		}
	}
	if found != 2 {
		return 0, fmt.Errorf("info cpu: used_cpu_sys and used_cpu_user not both present")
	}
	return sum, nil
}

// cpuMeter samples the three CPU counters at the start and at the end of a drain.
type cpuMeter struct {
	rdb      *redis.Client
	kafkaPID int // 0: broker not measured
	child    int

	kafka0, redis0 float64
}

func (m *cpuMeter) start(ctx context.Context) error {
	var err error
	if m.redis0, err = redisCPU(ctx, m.rdb); err != nil {
		return err
	}
	if m.kafkaPID != 0 {
		if m.kafka0, err = procCPU(m.kafkaPID); err != nil {
			return fmt.Errorf("kafka broker cpu: %w", err)
		}
	}
	return nil
}

// stop returns the CPU seconds since start of the mode's process (its whole
// life so far: it started with the drain), of Kafka's broker (-1 when not
// measured) and of Redis.
func (m *cpuMeter) stop(ctx context.Context) (process, kafka, rds float64, err error) {
	if process, err = procCPU(m.child); err != nil {
		return 0, 0, 0, fmt.Errorf("mode cpu: %w", err)
	}
	kafka = -1
	if m.kafkaPID != 0 {
		k, err := procCPU(m.kafkaPID)
		if err != nil {
			return 0, 0, 0, fmt.Errorf("kafka broker cpu: %w", err)
		}
		kafka = k - m.kafka0
	}
	r, err := redisCPU(ctx, m.rdb)
	if err != nil {
		return 0, 0, 0, err
	}
	return process, kafka, r - m.redis0, nil
}
