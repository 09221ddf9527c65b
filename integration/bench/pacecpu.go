package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"
)

// Side-by-side modes: two gatekeeper binaries that differ in one setting
// read the same source topic while events are produced into it at a steady
// rate, every event within its limits, and each one's CPU per million
// events is measured. Side by side, both see the same load from the rest of
// the machine, which one run after the other does not (on a shared machine,
// two such runs differ by more than the 5% or 10% to resolve).
const (
	// modePaceCPU is what pacing by the downstream (GATEKEEPER_CAPACITY_FROM)
	// costs the gate: one side with a fixed capacity, the other paced by a
	// downstream group that has a member.
	modePaceCPU = "pace-cpu"
	// modeCapacityCPU is what a shared capacity (G12) costs the gate and
	// its Redis: one side without a capacity, the other with one that never
	// binds (as the gatekeeper-capacity mode), each with a Redis server of
	// its own, started by the mode, whose CPU is measured too.
	modeCapacityCPU = "capacity-cpu"
)

// sideBySide describes a side-by-side mode.
type sideBySide struct {
	mode  string
	sides [2]string
	// vars sets side i's own variables over the common ones.
	vars func(i int, v map[string]string, downGroup string)
	// ownRedis: each side gets a Redis server of its own, whose CPU
	// (INFO cpu) is measured with its gatekeeper's.
	ownRedis     bool
	title, about string
}

var sideBySideModes = []sideBySide{
	{
		mode: modePaceCPU, sides: [2]string{"fixed", "paced"},
		vars: func(i int, v map[string]string, down string) {
			if i == 1 {
				v["CAPACITY_FROM"] = "group:" + down
			}
		},
		title: "Pacing by the downstream: what it costs the gate",
		about: "Two gatekeeper binaries side by side, both with `CAPACITY=1000000000/1s`, one of them also with `CAPACITY_FROM=group:<downstream group>` (a member of that group reads and commits the downstream topic; the paced gatekeeper is the fleet's only replica, so it takes the lease and reads the downstream four times a second), read the same source topic while its events are produced at a steady rate, every event within its limits; each one's CPU (/proc) from the first event produced until the downstream topic holds both copies of every event. Side by side, the rest of the machine's load falls on both.",
	},
	{
		mode: modeCapacityCPU, sides: [2]string{"none", "capacity"}, ownRedis: true,
		vars: func(i int, v map[string]string, _ string) {
			if i == 0 {
				delete(v, "CAPACITY")
			}
		},
		title: "A shared capacity: what it costs the gate and Redis",
		about: "Two gatekeeper binaries side by side, each with a Redis server of its own, one without a capacity and one with `CAPACITY=1000000000/1s` (never binding: every event is still booked in it and in its tenant's share), read the same source topic while its events are produced at a steady rate, every event within its limits; each one's CPU (/proc) and its Redis's (INFO cpu) from the first event produced until the downstream topic holds both copies of every event. On a machine where the gate, Redis and Kafka share the cores, their sum sets the events a second a drain reaches. Side by side, the rest of the machine's load falls on both.",
	},
}

// sideCPUResult is one rate of a side-by-side mode.
type sideCPUResult struct {
	Mode   string `json:"mode"`
	Rate   int    `json:"rate"`
	Events int    `json:"events"`
	// CPU is each side's gatekeeper process, Redis its own Redis server's
	// (ownRedis), in CPU seconds.
	CPU   [2]float64 `json:"cpu_seconds"`
	Redis [2]float64 `json:"redis_cpu_seconds,omitzero"`
	Load  string     `json:"load_average"`
}

// perM returns CPU seconds per million events.
func (r sideCPUResult) perM(sec float64) float64 { return sec * 1e6 / float64(max(r.Events, 1)) }

// sideBySideScenario runs each side-by-side mode asked for at each of
// o.PaceCPURates.
func (d *driver) sideBySideScenario(ctx context.Context, rep *report) error {
	for _, sb := range sideBySideModes {
		if !containsMode(d.o.Modes, sb.mode) {
			continue
		}
		for _, rate := range d.o.PaceCPURates {
			r, err := d.runSideBySide(ctx, sb, rate)
			if err != nil {
				return fmt.Errorf("%s at %d/s: %w", sb.mode, rate, err)
			}
			line := fmt.Sprintf("[%s] %d/s: %d events; gate CPU per million events: %s %.2f s, %s %.2f s (%+.1f%%)",
				sb.mode, rate, r.Events, sb.sides[0], r.perM(r.CPU[0]), sb.sides[1], r.perM(r.CPU[1]), 100*(r.CPU[1]/r.CPU[0]-1))
			if sb.ownRedis {
				s0, s1 := r.CPU[0]+r.Redis[0], r.CPU[1]+r.Redis[1]
				line += fmt.Sprintf("; its Redis %.2f s, %.2f s; gate and Redis %.2f s, %.2f s (%+.1f%%)",
					r.perM(r.Redis[0]), r.perM(r.Redis[1]), r.perM(s0), r.perM(s1), 100*(s1/s0-1))
			}
			logf("%s; load %s", line, r.Load)
			rep.SideBySide = append(rep.SideBySide, r)
			if err := rep.write(d.o.Out); err != nil {
				return err
			}
		}
	}
	return nil
}

// runSideBySide measures both gatekeepers' CPU from the first of
// o.PaceCPUFor of events produced at rate a second until both have
// forwarded them all.
func (d *driver) runSideBySide(ctx context.Context, sb sideBySide, rate int) (sideCPUResult, error) {
	res := sideCPUResult{Mode: sb.mode, Rate: rate}
	nm := newModeNames(d.runID, fmt.Sprintf("%s%d", strings.ReplaceAll(sb.mode, "-", ""), rate))
	src := nm.base + "-src"
	if err := d.admin.createTopics(ctx, d.o.Workload.Partitions, false, src); err != nil {
		return res, err
	}
	if err := d.admin.createTopics(ctx, d.o.Workload.Partitions, true, nm.outputs...); err != nil {
		return res, err
	}
	defer func() {
		if !d.o.Keep {
			d.cleanupTopics(context.WithoutCancel(ctx), append([]string{src}, nm.outputs...)...)
			for _, side := range sb.sides {
				_, _ = deletePrefix(context.WithoutCancel(ctx), d.rdb, nm.base+"-"+side)
			}
		}
	}()

	// Each side's Redis: the driver's, or one of its own.
	var rdbs [2]*redis.Client
	addrs := [2]string{d.o.Redis, d.o.Redis}
	if sb.ownRedis {
		for i, side := range sb.sides {
			addr, stop, err := startRedis(ctx, filepath.Join(d.o.Work, nm.base+"-"+side+"-redis.log"))
			if err != nil {
				return res, fmt.Errorf("the %s side's Redis: %w", side, err)
			}
			defer stop()
			addrs[i] = addr
			rdbs[i] = redis.NewClient(&redis.Options{Addr: addr, DialTimeout: redisTimeout, ReadTimeout: redisTimeout, WriteTimeout: redisTimeout})
			defer rdbs[i].Close()
		}
	}

	// The downstream group: one member that reads and commits what both
	// gatekeepers forward.
	mctx, stopMember := context.WithCancel(ctx)
	defer stopMember()
	down := nm.base + "-down"
	rd := kafka.NewReader(kafka.ReaderConfig{Brokers: d.o.Brokers, GroupID: down, Topic: nm.out, CommitInterval: 200 * time.Millisecond})
	memberDone := make(chan struct{})
	go func() {
		defer close(memberDone)
		for mctx.Err() == nil {
			if _, err := rd.ReadMessage(mctx); err != nil && mctx.Err() == nil {
				time.Sleep(100 * time.Millisecond)
			}
		}
	}()
	defer func() { stopMember(); <-memberDone; rd.Close() }()

	var procs []*exec.Cmd
	for i, side := range sb.sides {
		vars := map[string]string{
			"KAFKA_BROKERS":    strings.Join(d.o.Brokers, ","),
			"GROUP_ID":         nm.base + "-" + side,
			"SOURCE_TOPICS":    src,
			"DOWNSTREAM_TOPIC": nm.out,
			"REDIS_ADDRS":      addrs[i],
			"REDIS_KEY_PREFIX": nm.base + "-" + side,
			// Every event within its tenant's limit: the same admissions on both sides.
			"LIMITS":     "*=100000000/1h",
			"BATCH_SIZE": strconv.Itoa(d.o.Batch),
			"HTTP_ADDR":  "127.0.0.1:0",
			"CAPACITY":   "1000000000/1s",
		}
		sb.vars(i, vars, down)
		logPath := filepath.Join(d.o.Work, nm.base+"-"+side+".log")
		f, err := os.Create(logPath)
		if err != nil {
			return res, err
		}
		defer f.Close()
		cmd := exec.Command(d.o.GKBin)
		cmd.Env = gatekeeperEnv(vars, d.o.GKEnv)
		cmd.Stdout, cmd.Stderr = f, f
		if err := cmd.Start(); err != nil {
			return res, fmt.Errorf("start the %s gatekeeper: %w", side, err)
		}
		defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
		procs = append(procs, cmd)
	}
	// Both join their groups (and a paced one takes the lease and reads
	// the downstream) before the measurement starts.
	select {
	case <-ctx.Done():
		return res, ctx.Err()
	case <-time.After(10 * time.Second):
	}
	cpu := func() (procCPUs, redisCPUs [2]float64, err error) {
		var errs []error
		for i := range procs {
			c, err := procCPU(procs[i].Process.Pid)
			procCPUs[i] = c
			errs = append(errs, err)
			if rdbs[i] != nil {
				r, err := redisCPU(ctx, rdbs[i])
				redisCPUs[i] = r
				errs = append(errs, err)
			}
		}
		return procCPUs, redisCPUs, errors.Join(errs...)
	}
	c0, r0, err := cpu()
	if err != nil {
		return res, fmt.Errorf("a gatekeeper or its Redis exited before the measurement (logs in %s): %w", d.o.Work, err)
	}
	res.Events = rate * int(d.o.PaceCPUFor.Seconds())
	if err := producePaced(ctx, d.o.Brokers, src, d.o.Workload, res.Events, rate); err != nil {
		return res, err
	}
	// Both must forward every event, else they did not do the same work:
	// the measurement ends when the downstream topic holds both copies.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		n, err := d.admin.total(ctx, d.o.Workload.Partitions, nm.out)
		if err != nil {
			return res, err
		}
		if n >= int64(2*res.Events) {
			break
		}
		if time.Now().After(deadline) {
			return res, fmt.Errorf("the downstream topic holds %d events 2 minutes after the last was produced, not the %d both gatekeepers forward (logs in %s)", n, 2*res.Events, d.o.Work)
		}
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
	c1, r1, err := cpu()
	if err != nil {
		return res, fmt.Errorf("a gatekeeper or its Redis exited during the measurement (logs in %s): %w", d.o.Work, err)
	}
	for i := range 2 {
		res.CPU[i], res.Redis[i] = c1[i]-c0[i], r1[i]-r0[i]
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		res.Load = strings.Fields(string(b))[0]
	}
	return res, nil
}

// startRedis starts a redis-server of its own on a free loopback port,
// without persistence, logging to logPath, and waits until it answers.
func startRedis(ctx context.Context, logPath string) (addr string, stop func(), err error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return "", nil, fmt.Errorf("redis-server not found (make bench installs it): %w", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--logfile", logPath)
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	stop = func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }
	addr = "127.0.0.1:" + strconv.Itoa(port)
	rdb := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: time.Second, ReadTimeout: time.Second})
	defer rdb.Close()
	for deadline := time.Now().Add(10 * time.Second); ; {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		err := rdb.Ping(pctx).Err()
		cancel()
		if err == nil {
			return addr, stop, nil
		}
		if time.Now().After(deadline) {
			stop()
			return "", nil, fmt.Errorf("redis-server on %s not answering after 10 s (log %s): %w", addr, logPath, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// sideBySideTables are the side-by-side modes' sections of the report.
func (r *report) sideBySideTables() string {
	var b strings.Builder
	for _, sb := range sideBySideModes {
		var rows []sideCPUResult
		for _, x := range r.SideBySide {
			if x.Mode == sb.mode {
				rows = append(rows, x)
			}
		}
		if len(rows) == 0 {
			continue
		}
		fmt.Fprintf(&b, "\n## %s\n\n%s\n\n", sb.title, sb.about)
		a, c := sb.sides[0], sb.sides[1]
		if !sb.ownRedis {
			fmt.Fprintf(&b, "| events a second | events | %s: gate CPU per million events | %s | %s ÷ %s | load average at the end |\n|---:|---:|---:|---:|---:|---:|\n", a, c, c, a)
			for _, x := range rows {
				fmt.Fprintf(&b, "| %d | %d | %.2f s | %.2f s | %.3f | %s |\n", x.Rate, x.Events, x.perM(x.CPU[0]), x.perM(x.CPU[1]), x.CPU[1]/x.CPU[0], x.Load)
			}
			continue
		}
		fmt.Fprintf(&b, "| events a second | events | %s: gate / its Redis / both, CPU per million events | %s: the same | gate %s ÷ %s | both %s ÷ %s | load average at the end |\n|---:|---:|---:|---:|---:|---:|---:|\n", a, c, c, a, c, a)
		for _, x := range rows {
			s0, s1 := x.CPU[0]+x.Redis[0], x.CPU[1]+x.Redis[1]
			fmt.Fprintf(&b, "| %d | %d | %.2f / %.2f / %.2f s | %.2f / %.2f / %.2f s | %.3f | %.3f | %s |\n", x.Rate, x.Events,
				x.perM(x.CPU[0]), x.perM(x.Redis[0]), x.perM(s0), x.perM(x.CPU[1]), x.perM(x.Redis[1]), x.perM(s1), x.CPU[1]/x.CPU[0], s1/s0, x.Load)
		}
	}
	return b.String()
}
