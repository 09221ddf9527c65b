// Package lua holds Gatekeeper's Redis scripts, embedded at build time. Each
// source file starts with a comment giving its KEYS, ARGV and reply; the
// limit package runs them. All scripts take times from the caller's clock.
package lua

import (
	_ "embed"
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

// Admit is the batch admission script: admit, reserve, reject for many
// tenants in one call: admit.lua with capacity.lua joined where it says so.
var Admit = join(admitBody, capacityMark, capacityPart)

//go:embed admit.lua
var admitBody string

// capacityPart is the shared capacity's part of Admit (see its header).
//
//go:embed capacity.lua
var capacityPart string

// capacityMark is the line of admit.lua that capacity.lua replaces.
const capacityMark = "-- @capacity.lua (the shared capacity's part is joined here: lua.go)\n"

// join returns body with part in place of its one line mark; it panics when
// the mark is not there once (a build mistake, caught by any test).
func join(body, mark, part string) string {
	if strings.Count(body, mark) != 1 {
		panic("lua: the mark " + strings.TrimSpace(mark) + " is not in the script once")
	}
	return strings.Replace(body, mark, part, 1)
}
