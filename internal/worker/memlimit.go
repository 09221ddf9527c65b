package worker

import (
	"bufio"
	"bytes"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
)

// memLimitShare is the part of the container's memory limit given to the Go
// runtime as its soft limit (GOMEMLIMIT): the rest is for what the runtime
// does not count (stacks beyond the heap's, the binary, kernel buffers) and
// for the collector to react before the kernel kills the process.
const memLimitShare = 0.9

// noMemLimit is the value at and above which a cgroup v1 limit means none
// (the kernel shows "unlimited" as the largest page-aligned int64).
const noMemLimit = 1 << 60

// cgroupFS reads the cgroup files; tests replace it.
type cgroupFS struct {
	root     string // where the cgroup file systems are mounted: /sys/fs/cgroup
	readFile func(string) ([]byte, error)
}

var hostCgroups = cgroupFS{root: "/sys/fs/cgroup", readFile: os.ReadFile}

// memoryLimit returns the memory limit of this process's cgroup in bytes
// and the file it came from; 0 when there is none (or it cannot be read).
// It reads cgroup v2 (memory.max) and v1 (memory/memory.limit_in_bytes), at
// the process's own cgroup path (/proc/self/cgroup) and at the root of the
// mount, which in a container is the container's own cgroup.
func (fs cgroupFS) memoryLimit() (int64, string) {
	var candidates []string
	if b, err := fs.readFile("/proc/self/cgroup"); err == nil {
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			// hierarchy-ID:controllers:path
			f := strings.SplitN(sc.Text(), ":", 3)
			if len(f) != 3 {
				continue
			}
			switch {
			case f[0] == "0" && f[1] == "":
				candidates = append(candidates, filepath.Join(fs.root, f[2], "memory.max"))
			case hasController(f[1], "memory"):
				candidates = append(candidates, filepath.Join(fs.root, "memory", f[2], "memory.limit_in_bytes"))
			}
		}
	}
	candidates = append(candidates, filepath.Join(fs.root, "memory.max"), filepath.Join(fs.root, "memory", "memory.limit_in_bytes"))
	for _, path := range candidates {
		b, err := fs.readFile(path)
		if err != nil {
			continue
		}
		s := strings.TrimSpace(string(b))
		if s == "max" {
			continue
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n <= 0 || n >= noMemLimit {
			continue
		}
		return n, path
	}
	return 0, ""
}

func hasController(list, name string) bool {
	for _, c := range strings.Split(list, ",") {
		if c == name {
			return true
		}
	}
	return false
}

// setMemoryLimit gives the Go runtime a soft memory limit of memLimitShare
// of the cgroup's memory limit, unless GOMEMLIMIT is set (the runtime has
// read it then) or there is no limit. It returns the limit set (0: none)
// and the cgroup file it came from, for the start-up log.
func setMemoryLimit(getenv func(string) string, fs cgroupFS) (int64, string) {
	if getenv("GOMEMLIMIT") != "" {
		return 0, ""
	}
	n, from := fs.memoryLimit()
	if n == 0 {
		return 0, ""
	}
	soft := int64(math.Floor(float64(n) * memLimitShare))
	debug.SetMemoryLimit(soft)
	return soft, from
}
