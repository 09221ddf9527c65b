// Package lua holds Gatekeeper's Redis scripts, embedded at build time. Each
// source file starts with a comment giving its KEYS, ARGV and reply; the
// limit package runs them. All scripts take times from the caller's clock.
package lua

import _ "embed"

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

// Admit is the batch admission script: admit, reserve, reject for many tenants in one call.
//
//go:embed admit.lua
var Admit string

// Release gives back the slot of a deferred event that came back after its
// slot ended, once per trip.
//
//go:embed release.lua
var Release string
