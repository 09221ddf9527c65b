package lua

import _ "embed"

// OverrideWrite sets or deletes a live override, compare-and-set on its
// version, with its audit entry: {1, version}, {0, current} when stale.
//
//go:embed override_write.lua
var OverrideWrite string

// OverrideExpire deletes expired live overrides, each audited: the number deleted.
//
//go:embed override_expire.lua
var OverrideExpire string
