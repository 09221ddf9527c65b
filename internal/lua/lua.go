// Package lua holds Gatekeeper's Redis scripts, embedded at build time. Each
// source file starts with a comment giving its KEYS, ARGV and reply; the
// limit package runs them. All scripts take times from the caller's clock.
package lua

import (
	"embed"
	"strings"
)

// TTLIncr is the seed's ttl-window increment: {count, seconds left}.
//
//go:embed ttl_incr.lua
var TTLIncr string

// TTLGet is the seed's ttl-window current count: {count, seconds left}, {0, 0} when absent.
//
//go:embed ttl_get.lua
var TTLGet string

// AlignedIncr is the seed's aligned-window increment: {count, expire ms}.
//
//go:embed aligned_incr.lua
var AlignedIncr string

// AlignedGet is the seed's aligned-window current count: {count, expire ms}, {0, now} when absent or expired.
//
//go:embed aligned_get.lua
var AlignedGet string

// admitSources are the parts of the batch admission script, one idea each,
// each with its contract in its header; AdmitParts joins them in this order.
//
//go:embed admit/*.lua
var admitSources embed.FS

// AdmitParts are the names of the parts of Admit under admit/, in the
// order they are joined: a part may use what the parts before it define.
// The first holds the script's contract (KEYS, ARGV, reply).
var AdmitParts = []string{
	"10_call.lua",
	"20_journal.lua",
	"30_windows.lua",
	"35_capacity.lua",
	"40_decode.lua",
	"50_costs.lua",
	"60_replay.lua",
	"70_admit.lua",
	"80_reserve.lua",
	"85_late.lua",
	"87_advance.lua",
	"90_run.lua",
}

// Admit is the batch admission script: admit, reserve, reject for many
// tenants in one call. It is AdmitParts joined, each part ending in a
// newline; Redis loads it as one script, which comments elsewhere call
// admit.lua.
var Admit = join(admitSources, "admit/", AdmitParts)

// join returns the files names under dir of fsys, one after the other, each
// ending in one newline. A missing part is a build mistake: it panics at
// start-up (lua_test.go fails first).
func join(fsys embed.FS, dir string, names []string) string {
	var b strings.Builder
	for _, n := range names {
		src, err := fsys.ReadFile(dir + n)
		if err != nil {
			panic("lua: " + err.Error())
		}
		b.WriteString(strings.TrimRight(string(src), "\n"))
		b.WriteString("\n")
	}
	return b.String()
}

// TakesUntil reads and raises the bound on the due times of the slots late
// events took (see its header).
//
//go:embed takes_until.lua
var TakesUntil string

// ReplayDrop deletes a replay record once every decision it holds is below
// a committed offset (Redis Cluster: see replay_drop.lua).
//
//go:embed replay_drop.lua
var ReplayDrop string

// Release gives back the slot of a deferred event that came back after its
// slot ended, once per trip.
//
//go:embed release.lua
var Release string
