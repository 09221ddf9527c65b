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
// tenant's reply r: old itself when they are the same (within its limits a
// tenant's chains move only when a window opens, so most calls allocate
// nothing here), else a new slice (old is never changed: calls under way
// may read it).
func replyChains(old []chain, r []int64, rules int) []chain {
	at := len(r) - 2*rules
	if len(old) == rules {
		same := true
		for i := range old {
			if old[i] != (chain{start: r[at+2*i], end: r[at+2*i+1]}) {
				same = false
				break
			}
		}
		if same {
			return old
		}
	}
	cs := make([]chain, rules)
	for i := range cs {
		cs[i] = chain{start: r[at+2*i], end: r[at+2*i+1]}
	}
	return cs
}

// sentChains is replyChains for a reply that left g's chains as the call
// sent them (g.chainOf of each of its rules rules): old itself when they
// are the same, else g.chains (never changed in place either), or a new
// slice when the call sent none.
func sentChains(old []chain, g *group, rules int) []chain {
	if len(old) == rules {
		same := true
		for i := range old {
			if old[i] != g.chainOf(i) {
				same = false
				break
			}
		}
		if same {
			return old
		}
	}
	if len(g.chains) == rules {
		return g.chains
	}
	cs := make([]chain, rules)
	for i := range cs {
		cs[i] = g.chainOf(i)
	}
	return cs
}
