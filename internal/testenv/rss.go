package testenv

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// RSS returns the process's resident set size now (VmRSS) and its peak so
// far (VmHWM), in bytes, from /proc (Linux only).
func (p *Process) RSS() (now, peak int64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return 0, 0, fmt.Errorf("rss of %s: %w", p.Name, err)
	}
	field := func(name string) (int64, error) {
		for _, line := range strings.Split(string(b), "\n") {
			if rest, ok := strings.CutPrefix(line, name+":"); ok {
				kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
				return kb << 10, err
			}
		}
		return 0, fmt.Errorf("rss of %s: no %s in /proc status", p.Name, name)
	}
	if now, err = field("VmRSS"); err != nil {
		return 0, 0, err
	}
	peak, err = field("VmHWM")
	return now, peak, err
}
