package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
)

// modePaceCPU is what pacing by the downstream (GATEKEEPER_CAPACITY_FROM)
// costs the gate: two gatekeeper binaries side by side, one with a fixed
// capacity and one paced by a downstream group that has a member, read the
// same source topic while events are produced into it at a steady rate.
// Side by side, both see the same load from the rest of the machine, which
// one run after the other does not (on a shared machine, two such runs
// differ by more than the 5% to resolve).
const modePaceCPU = "pace-cpu"

// paceCPUResult is one rate of the pace-cpu mode.
type paceCPUResult struct {
	Rate   int     `json:"rate"`
	Events int     `json:"events"`
	Fixed  float64 `json:"fixed_cpu_seconds"`
	Paced  float64 `json:"paced_cpu_seconds"`
	Load   string  `json:"load_average"`
}

// perM returns the CPU seconds per million events of a side.
func (r paceCPUResult) perM(sec float64) float64 { return sec * 1e6 / float64(max(r.Events, 1)) }

// paceCPUScenario runs the pace-cpu mode at each of o.PaceCPURates.
func (d *driver) paceCPUScenario(ctx context.Context, rep *report) error {
	if !containsMode(d.o.Modes, modePaceCPU) {
		return nil
	}
	for _, rate := range d.o.PaceCPURates {
		r, err := d.runPaceCPU(ctx, rate)
		if err != nil {
			return fmt.Errorf("%s at %d/s: %w", modePaceCPU, rate, err)
		}
		logf("[%s] %d/s: %d events; gate CPU per million events: fixed capacity %.2f s, paced %.2f s (%+.1f%%); load %s",
			modePaceCPU, rate, r.Events, r.perM(r.Fixed), r.perM(r.Paced), 100*(r.Paced/r.Fixed-1), r.Load)
		rep.PaceCPU = append(rep.PaceCPU, r)
		if err := rep.write(d.o.Out); err != nil {
			return err
		}
	}
	return nil
}

// runPaceCPU measures both gatekeepers' CPU from the first of o.PaceCPUFor
// of events produced at rate a second until both have forwarded them all.
func (d *driver) runPaceCPU(ctx context.Context, rate int) (paceCPUResult, error) {
	res := paceCPUResult{Rate: rate}
	nm := newModeNames(d.runID, fmt.Sprintf("pacecpu%d", rate))
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
			for _, p := range []string{nm.base + "-fixed", nm.base + "-paced"} {
				_, _ = deletePrefix(context.WithoutCancel(ctx), d.rdb, p)
			}
		}
	}()

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

	vars := func(side string) map[string]string {
		return map[string]string{
			"KAFKA_BROKERS":    strings.Join(d.o.Brokers, ","),
			"GROUP_ID":         nm.base + "-" + side,
			"SOURCE_TOPICS":    src,
			"DOWNSTREAM_TOPIC": nm.out,
			"REDIS_ADDRS":      d.o.Redis,
			"REDIS_KEY_PREFIX": nm.base + "-" + side,
			// Every event within its tenant's limit: the same admissions on both sides.
			"LIMITS":     "*=100000000/1h",
			"BATCH_SIZE": strconv.Itoa(d.o.Batch),
			"HTTP_ADDR":  "127.0.0.1:0",
			"CAPACITY":   "1000000000/1s",
		}
	}
	paced := vars("paced")
	paced["CAPACITY_FROM"] = "group:" + down
	var procs []*exec.Cmd
	for _, side := range []struct {
		name string
		vars map[string]string
	}{{"fixed", vars("fixed")}, {"paced", paced}} {
		logPath := filepath.Join(d.o.Work, nm.base+"-"+side.name+".log")
		f, err := os.Create(logPath)
		if err != nil {
			return res, err
		}
		defer f.Close()
		cmd := exec.Command(d.o.GKBin)
		cmd.Env = gatekeeperEnv(side.vars, d.o.GKEnv)
		cmd.Stdout, cmd.Stderr = f, f
		if err := cmd.Start(); err != nil {
			return res, fmt.Errorf("start the %s gatekeeper: %w", side.name, err)
		}
		defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
		procs = append(procs, cmd)
	}
	// Both join their groups and the paced one takes the lease and reads
	// the downstream before the measurement starts.
	select {
	case <-ctx.Done():
		return res, ctx.Err()
	case <-time.After(10 * time.Second):
	}
	cpu := func() (fixed, paced float64, err error) {
		f, err1 := procCPU(procs[0].Process.Pid)
		p, err2 := procCPU(procs[1].Process.Pid)
		return f, p, errors.Join(err1, err2)
	}
	f0, p0, err := cpu()
	if err != nil {
		return res, fmt.Errorf("a gatekeeper exited before the measurement (logs in %s): %w", d.o.Work, err)
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
	f1, p1, err := cpu()
	if err != nil {
		return res, fmt.Errorf("a gatekeeper exited during the measurement (logs in %s): %w", d.o.Work, err)
	}
	res.Fixed, res.Paced = f1-f0, p1-p0
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		res.Load = strings.Fields(string(b))[0]
	}
	return res, nil
}

// paceCPUTable is the pace-cpu mode's table in the report.
func (r *report) paceCPUTable() string {
	if len(r.PaceCPU) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("| events a second | events | fixed capacity: gate CPU per million events | paced by the downstream | paced ÷ fixed | load average at the end |\n|---:|---:|---:|---:|---:|---:|\n")
	for _, x := range r.PaceCPU {
		fmt.Fprintf(&b, "| %d | %d | %.2f s | %.2f s | %.3f | %s |\n", x.Rate, x.Events, x.perM(x.Fixed), x.perM(x.Paced), x.Paced/x.Fixed, x.Load)
	}
	return b.String()
}
