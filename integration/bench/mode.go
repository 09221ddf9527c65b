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
	"syscall"
	"time"
)

// modeRun is one mode over one data set.
type modeRun struct {
	mode  string
	wl    workload
	src   string
	limit int
	batch int
	live  int
	tag   string
}

// modeNames are the names of one mode run's consumer group, Redis key
// prefix and topics.
type modeNames struct {
	base    string   // consumer group and Redis key prefix
	live    string   // the second source topic, for the paced phase
	out     string   // the downstream topic
	outputs []string // out, the three retry tiers and the dead-letter topic
}

func newModeNames(runID, tag string) modeNames {
	base := fmt.Sprintf("gkbench-%s-%s", runID, tag)
	out := base + "-out"
	return modeNames{base: base, live: base + "-live", out: out,
		outputs: []string{out, out + ".retry", out + ".retry.1h", out + ".retry.long", out + ".dlq"}}
}

// runMode runs one mode: it starts the process under measurement, waits
// until the backlog is drained, reads the figures, measures latency in a
// paced phase and stops the process.
func (d *driver) runMode(ctx context.Context, mr modeRun) (result, error) {
	nm := newModeNames(d.runID, mr.tag)
	res := result{Mode: mr.mode, Events: mr.wl.Events, Tenants: mr.wl.Tenants, Batch: mr.batch, Limit: mr.limit}
	if err := d.createModeTopics(ctx, mr, nm); err != nil {
		return res, err
	}
	if !d.o.Keep {
		defer d.cleanupMode(context.WithoutCancel(ctx), nm)
	}
	if mr.mode == modeGatekeeperOver {
		if err := d.seedOverrides(ctx, mr, nm); err != nil {
			return res, err
		}
	}
	if err := d.resetRedisStats(ctx, &res); err != nil {
		return res, err
	}
	ch, err := d.startChild(mr, nm)
	if err != nil {
		return res, err
	}
	defer ch.close()
	logf("[%s] started (pid %d, batch %d, log %s)", mr.tag, ch.cmd.Process.Pid, mr.batch, ch.logPath)
	meter := &cpuMeter{rdb: d.rdb, child: ch.cmd.Process.Pid}
	meter.kafkaPID, _ = pidFromFile(d.o.KafkaPIDFile)
	if err := meter.start(ctx); err != nil {
		return res, err
	}
	prof := d.startProfiles(ctx, ch, nm)
	if err := d.drain(ctx, mr, nm, ch); err != nil {
		return res, err
	}
	prof.stop()
	res.WallSeconds = time.Since(ch.started).Seconds()
	if res.DrainCPU, res.KafkaCPU, res.RedisCPU, err = meter.stop(ctx); err != nil {
		return res, err
	}
	ends, err := d.drainFigures(ctx, mr, nm, &res)
	if err != nil {
		return res, err
	}
	if mr.live > 0 {
		if err := d.pacedPhase(ctx, mr, nm, ends, ch, &res); err != nil {
			return res, err
		}
	}
	ch.finish(mr.tag, &res)
	return res, nil
}

// createModeTopics creates the mode's live source topic and its outputs.
func (d *driver) createModeTopics(ctx context.Context, mr modeRun, nm modeNames) error {
	if err := d.admin.createTopics(ctx, mr.wl.Partitions, false, nm.live); err != nil {
		return err
	}
	return d.admin.createTopics(ctx, mr.wl.Partitions, true, nm.outputs...)
}

// resetRedisStats resets Redis's statistics, noting in res other Redis
// clients whose calls the counts may include.
func (d *driver) resetRedisStats(ctx context.Context, res *result) error {
	if n, err := otherClients(ctx, d.rdb); err == nil && n > 0 {
		res.Notes = append(res.Notes, fmt.Sprintf("%d other Redis clients connected at start: command counts may include their calls", n))
		logf("warning: %d other clients are connected to Redis %s: its command counts may include their calls (use a Redis of its own: GATEKEEPER_BENCH_REDIS)", n, d.o.Redis)
	}
	return resetStats(ctx, d.rdb)
}

// cleanupMode deletes the mode's Redis keys and topics.
func (d *driver) cleanupMode(ctx context.Context, nm modeNames) {
	for _, p := range []string{nm.base, "rate:" + nm.base} {
		if _, err := deletePrefix(ctx, d.rdb, p); err != nil {
			logf("warning: delete redis keys %s*: %v", p, err)
		}
	}
	d.cleanupTopics(ctx, append([]string{nm.live}, nm.outputs...)...)
}

// child is the process under measurement: the gatekeeper binary or this
// command re-executed with -child.
type child struct {
	cmd     *exec.Cmd
	logPath string
	logFile *os.File
	started time.Time
	exited  chan error // receives the exit status once
	peakKB  int64      // the highest VmHWM read so far
	// pprofAddr is where a gatekeeper binary serves its profiles (-profile).
	pprofAddr string
}

// startChild starts the process of mr's mode, its output in a log file
// under the work directory.
func (d *driver) startChild(mr modeRun, nm modeNames) (*child, error) {
	ch := &child{logPath: filepath.Join(d.o.Work, nm.base+".log"), exited: make(chan error, 1)}
	var err error
	if ch.logFile, err = os.Create(ch.logPath); err != nil {
		return nil, err
	}
	if d.o.Profile && isBinary(mr.mode) {
		if ch.pprofAddr, err = freeAddr(); err != nil {
			return nil, err
		}
	}
	ch.cmd = d.childCommand(mr, nm, ch.pprofAddr)
	ch.cmd.Stdout, ch.cmd.Stderr = ch.logFile, ch.logFile
	ch.started = time.Now()
	if err := ch.cmd.Start(); err != nil {
		ch.logFile.Close()
		return nil, fmt.Errorf("start: %w", err)
	}
	go func() { ch.exited <- ch.cmd.Wait() }()
	return ch, nil
}

// benchLimits is the LIMITS of a gatekeeper mode: the limit in events, and
// for gatekeeper-bytes beside it the bytes of as many events (the value's
// size and 64 bytes for the key and headers), so that both rules bind at
// about the same point and every event's bytes are counted.
func benchLimits(mr modeRun, unit string) string {
	rules := fmt.Sprintf("*=%d/%s", mr.limit, unit)
	if mr.mode == modeGatekeeperBytes {
		rules += fmt.Sprintf(",%dB/%s", int64(mr.limit)*int64(mr.wl.EventSize+64), unit)
	}
	return rules
}

// childCommand is the command of mr's mode; a gatekeeper binary serves its
// profiles on pprofAddr when that is not empty.
func (d *driver) childCommand(mr modeRun, nm modeNames, pprofAddr string) *exec.Cmd {
	o := d.o
	if isBinary(mr.mode) {
		vars := map[string]string{
			"KAFKA_BROKERS":    strings.Join(o.Brokers, ","),
			"GROUP_ID":         nm.base,
			"SOURCE_TOPICS":    mr.src + "," + nm.live,
			"DOWNSTREAM_TOPIC": nm.out,
			"REDIS_ADDRS":      o.Redis,
			"REDIS_KEY_PREFIX": nm.base,
			"LIMITS":           benchLimits(mr, ruleUnit(o.WindowLen)),
			"WINDOW":           o.Window,
			"BATCH_SIZE":       strconv.Itoa(mr.batch),
			"HTTP_ADDR":        "127.0.0.1:0",
		}
		if mr.mode == modeGatekeeperCapacity {
			// Never binding: every event is still booked in it.
			vars["CAPACITY"] = "1000000000/1s"
		}
		if pprofAddr != "" {
			vars["HTTP_ADDR"], vars["PPROF"] = pprofAddr, "true"
		}
		cmd := exec.Command(o.GKBin)
		cmd.Env = gatekeeperEnv(vars, o.GKEnv)
		return cmd
	}
	c := childConfig{Mode: mr.mode, Brokers: strings.Join(o.Brokers, ","), Redis: o.Redis, Group: nm.base,
		Sources: mr.src + "," + nm.live, Downstream: nm.out, BatchSize: mr.batch, Limit: int64(mr.limit),
		Window: o.WindowLen, WindowKind: o.Window, Prefix: nm.base}
	if o.Profile {
		c.CPUProfile, _ = filepath.Abs(filepath.Join(o.Work, nm.base+".cpu.pprof"))
	}
	return exec.Command(d.self, c.args()...)
}

// stop sends SIGTERM and waits up to 45 seconds for the exit, then kills
// the process. It returns the exit status; nil if it had exited already.
func (ch *child) stop() error {
	if ch.cmd.ProcessState != nil {
		return nil
	}
	_ = ch.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-ch.exited:
		return err
	case <-time.After(45 * time.Second):
		_ = ch.cmd.Process.Kill()
		<-ch.exited
		return errors.New("did not stop within 45s of SIGTERM; killed")
	}
}

// close stops the process if it still runs and closes its log file.
func (ch *child) close() {
	_ = ch.stop()
	ch.logFile.Close()
}

// sampleRSS reads the child's peak RSS, its VmHWM, while it runs. (rusage's
// Maxrss would do, but on Linux a child started by vfork+exec reports at
// least the parent's RSS at the fork.)
func (ch *child) sampleRSS() {
	if kb, err := vmHWM(ch.cmd.Process.Pid); err == nil {
		ch.peakKB = max(ch.peakKB, kb)
	}
}

// finish stops the child and puts its peak RSS and CPU time in res.
func (ch *child) finish(tag string, res *result) {
	ch.sampleRSS()
	res.PeakRSSMB = float64(ch.peakKB) / 1024
	if err := ch.stop(); err != nil {
		res.Notes = append(res.Notes, fmt.Sprintf("stop: %v", err))
		logf("[%s] warning: stop: %v", tag, err)
	}
	if ru, ok := ch.cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		res.CPUSeconds = time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
	}
	logf("[%s] peak RSS %.0f MB, CPU %.1fs", tag, res.PeakRSSMB, res.CPUSeconds)
}

// drain waits until the outputs hold every event of the backlog, with a
// progress line every 5 seconds. It fails when the child exits, makes no
// progress for StallTimeout or is not done within ModeTimeout.
func (d *driver) drain(ctx context.Context, mr modeRun, nm modeNames, ch *child) error {
	o := d.o
	want := int64(mr.wl.Events)
	deadline := time.Now().Add(o.ModeTimeout)
	var lastN, progressN int64
	lastT, lastLog, progressT := time.Now(), time.Now(), time.Now()
	for {
		n, err := d.admin.total(ctx, mr.wl.Partitions, nm.outputs...)
		if err != nil {
			return err
		}
		if n >= want {
			return nil
		}
		if n != progressN {
			progressN, progressT = n, time.Now()
		} else if time.Since(progressT) > o.StallTimeout {
			return fmt.Errorf("no progress for %v (%d/%d events out); see %s", o.StallTimeout, n, want, ch.logPath)
		}
		if time.Since(lastLog) >= 5*time.Second {
			rate := float64(n-lastN) / time.Since(lastT).Seconds()
			logf("[%s] %d/%d events out (%.0f%%), %.0f ev/s, %s", mr.tag, n, want, 100*float64(n)/float64(want), rate,
				time.Since(ch.started).Round(time.Second))
			lastN, lastT, lastLog = n, time.Now(), time.Now()
		}
		ch.sampleRSS()
		select {
		case err := <-ch.exited:
			return fmt.Errorf("exited early (%v); see %s", err, ch.logPath)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not drained within %v (%d/%d events out)", o.ModeTimeout, n, want)
		}
	}
}

// drainFigures reads Redis's statistics and the outputs' end offsets after
// the drain into res, and returns the end offsets by topic and partition.
func (d *driver) drainFigures(ctx context.Context, mr modeRun, nm modeNames, res *result) (map[string]map[int]int64, error) {
	stats, usec, err := readStats(ctx, d.rdb)
	if err != nil {
		return nil, err
	}
	res.RedisCalls, res.EvalSHA = stats.total(), stats["evalsha"]
	res.RedisBusySeconds = float64(usec.busy()) / 1e6
	res.TopCommands = stats.top(8)
	ends := map[string]map[int]int64{}
	for _, t := range nm.outputs {
		if ends[t], err = d.admin.ends(ctx, t, mr.wl.Partitions); err != nil {
			return nil, err
		}
	}
	out := nm.out
	res.Forwarded = sum(ends[out])
	res.Diverted = sum(ends[out+".retry"]) + sum(ends[out+".retry.1h"]) + sum(ends[out+".retry.long"])
	res.DeadLettered = sum(ends[out+".dlq"])
	first, last, err := d.admin.appendSpan(ctx, ends)
	if err != nil {
		return nil, err
	}
	res.Seconds = last.Sub(first).Seconds()
	res.EventsPerSec = float64(mr.wl.Events) / max(res.Seconds, 0.001)
	logf("[%s] drained %d events in %.1fs: %.0f ev/s; redis calls %d (evalsha %d), redis busy %.2fs; out %d, diverted %d, dlq %d",
		mr.tag, mr.wl.Events, res.Seconds, res.EventsPerSec, res.RedisCalls, res.EvalSHA, res.RedisBusySeconds, res.Forwarded, res.Diverted, res.DeadLettered)
	logf("[%s] CPU from start to drained: process %.2fs, Kafka broker %s, Redis %.2fs", mr.tag, res.DrainCPU, kafkaCPU(res.KafkaCPU), res.RedisCPU)
	return ends, nil
}

// pacedPhase measures the latency from source append to output append of
// mr.live paced events into res.
func (d *driver) pacedPhase(ctx context.Context, mr modeRun, nm modeNames, ends map[string]map[int]int64, ch *child, res *result) error {
	lat, err := d.latency(ctx, mr, nm.live, nm.outputs, ends, ch.exited)
	if err != nil {
		return err
	}
	res.LatencyN = len(lat)
	res.P50ms, res.P99ms = percentile(lat, 0.50), percentile(lat, 0.99)
	logf("[%s] latency over %d paced events at %d ev/s: p50 %.1f ms, p99 %.1f ms", mr.tag, len(lat), d.o.LiveRate, res.P50ms, res.P99ms)
	return nil
}
