package worker

import (
	"io/fs"
	"runtime/debug"
	"testing"
)

func fakeCgroups(files map[string]string) cgroupFS {
	return cgroupFS{root: "/sys/fs/cgroup", readFile: func(p string) ([]byte, error) {
		if s, ok := files[p]; ok {
			return []byte(s), nil
		}
		return nil, fs.ErrNotExist
	}}
}

// The cgroup's memory limit is found for cgroup v2 and v1, at the process's
// own cgroup path or the mount's root; "max", v1's "unlimited" and garbage
// mean none.
func TestCgroupMemoryLimit(t *testing.T) {
	tests := []struct {
		name     string
		files    map[string]string
		want     int64
		wantFrom string
	}{
		{name: "v2 own path", files: map[string]string{
			"/proc/self/cgroup":                          "0::/kubepods/pod1/c1\n",
			"/sys/fs/cgroup/kubepods/pod1/c1/memory.max": "536870912\n",
			"/sys/fs/cgroup/memory.max":                  "max\n",
		}, want: 536870912, wantFrom: "/sys/fs/cgroup/kubepods/pod1/c1/memory.max"},
		{name: "v2 in a container (root of the mount)", files: map[string]string{
			"/proc/self/cgroup":         "0::/\n",
			"/sys/fs/cgroup/memory.max": "268435456\n",
		}, want: 268435456, wantFrom: "/sys/fs/cgroup/memory.max"},
		{name: "v2 max", files: map[string]string{
			"/proc/self/cgroup":         "0::/\n",
			"/sys/fs/cgroup/memory.max": "max\n",
		}},
		{name: "v1", files: map[string]string{
			"/proc/self/cgroup": "9:name=systemd:/\n4:memory:/process_api/abc\n0::/\n",
			"/sys/fs/cgroup/memory/process_api/abc/memory.limit_in_bytes": "1073741824\n",
		}, want: 1073741824, wantFrom: "/sys/fs/cgroup/memory/process_api/abc/memory.limit_in_bytes"},
		{name: "v1 unlimited", files: map[string]string{
			"/proc/self/cgroup":                           "4:cpu,memory:/\n",
			"/sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n",
		}},
		{name: "garbage", files: map[string]string{"/sys/fs/cgroup/memory.max": "lots\n"}},
		{name: "no cgroup files"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, from := fakeCgroups(tt.files).memoryLimit()
			if got != tt.want || from != tt.wantFrom {
				t.Errorf("got %d from %q, want %d from %q", got, from, tt.want, tt.wantFrom)
			}
		})
	}
}

// Without GOMEMLIMIT the runtime's soft limit becomes 90% of the cgroup's;
// GOMEMLIMIT, set by the operator, wins; no cgroup limit changes nothing.
func TestSetMemoryLimit(t *testing.T) {
	orig := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(orig) })
	limited := fakeCgroups(map[string]string{"/sys/fs/cgroup/memory.max": "1000000000"})
	env := func(v string) func(string) string {
		return func(k string) string {
			if k == "GOMEMLIMIT" {
				return v
			}
			return ""
		}
	}
	debug.SetMemoryLimit(orig)
	if soft, _ := setMemoryLimit(env("400MiB"), limited); soft != 0 || debug.SetMemoryLimit(-1) != orig {
		t.Errorf("GOMEMLIMIT set: got %d, limit %d; want nothing changed", soft, debug.SetMemoryLimit(-1))
	}
	if soft, _ := setMemoryLimit(env(""), fakeCgroups(nil)); soft != 0 || debug.SetMemoryLimit(-1) != orig {
		t.Errorf("no cgroup limit: got %d; want nothing changed", soft)
	}
	soft, from := setMemoryLimit(env(""), limited)
	if soft != 900000000 || debug.SetMemoryLimit(-1) != 900000000 || from != "/sys/fs/cgroup/memory.max" {
		t.Errorf("got %d from %q, runtime limit %d; want 900000000 from /sys/fs/cgroup/memory.max", soft, from, debug.SetMemoryLimit(-1))
	}
}
