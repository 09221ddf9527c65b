package main

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestDemoCapacity runs the demo with its capacity on the embedded Redis
// (the admit script's capacity part in gopher-lua) and checks its summary:
// every capacity window within the capacity.
func TestDemoCapacity(t *testing.T) {
	demoCapacity(t, "50/1s")
}

// TestDemoCapacityBytes is TestDemoCapacity with a capacity of bytes (the
// script's unpacked demand histogram and the events' costs in gopher-lua).
func TestDemoCapacityBytes(t *testing.T) {
	demoCapacity(t, "4KB/1s")
}

func demoCapacity(t *testing.T, capacity string) {
	var out, logs lockedBuffer
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	_, err := runDemo(ctx, demoOptions{
		Duration:   4 * time.Second,
		Out:        &out,
		PlainEvery: time.Second,
		Log:        &logs,
		Drain:      time.Minute,
		Capacity:   capacity,
	})
	t.Logf("demo output:\n%s", out.String())
	if err != nil {
		t.Fatalf("runDemo: %v (logs: %s)", err, logs.String())
	}
	if !strings.Contains(out.String(), "over the capacity 0") {
		t.Errorf("no capacity line with no window over the capacity in the summary")
	}
}
