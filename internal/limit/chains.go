package limit

// Ttl chains in the local cache. A ttl rule's windows chain back to back
// from its anchor while deferred demand exists (see admit.lua); a chain
// never moves before its end, so what the last reply said of each rule's
// chain lets the script skip reading the anchor while now is before its
// end, for every tenant, whatever its number of rules (the script checks
// the anchor before it opens a window on the strength of the cache).

// chainOf returns the cached chain of g's i-th rule, zero when unknown.
func (g *group) chainOf(i int) chain {
	if i < len(g.chains) {
		return g.chains[i]
	}
	return chain{}
}

// replyChains returns the chains (start, end) of rules rules that end a
// tenant's reply r.
func replyChains(r []int64, rules int) []chain {
	cs := make([]chain, rules)
	at := len(r) - 2*rules
	for i := range cs {
		cs[i] = chain{start: r[at+2*i], end: r[at+2*i+1]}
	}
	return cs
}
