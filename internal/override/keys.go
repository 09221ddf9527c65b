package override

// Key layout of the overrides: one {hash tag} for all of them, so that one
// script call touches them all on Redis Cluster. The tag holds "/", which no
// tenant's key form holds (limit's keys.go writes such tenants in base64),
// so no tenant's counters share these names.
//
//	<prefix>:{<prefix>/overrides}:rec   hash: tenant -> "<version> <record JSON>"
//	<prefix>:{<prefix>/overrides}:ver   string: the last version given out
//	<prefix>:{<prefix>/overrides}:log   stream: the audit entries, one per version
//	<prefix>:{<prefix>/overrides}:exp   sorted set: tenants by expiry (unix ms)
//	<prefix>:{<prefix>/overrides}:flr   hash: tenant -> its override's floors (floors.go)
//	<prefix>:{<prefix>/overrides}:fsum  hash: window -> the sum of flr's floors, and "*built"
type keys struct {
	rec, ver, log, exp, flr, fsum string
}

func newKeys(prefix string) keys {
	base := prefix + ":{" + prefix + "/overrides}:"
	return keys{rec: base + "rec", ver: base + "ver", log: base + "log", exp: base + "exp", flr: base + "flr", fsum: base + "fsum"}
}

func (k keys) all() []string { return []string{k.rec, k.ver, k.log, k.exp, k.flr, k.fsum} }
