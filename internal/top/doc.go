// Package top is the operator's view of who is throttled: each replica
// counts its decisions per tenant in memory (Tracker), in fixed windows,
// and publishes its top tenants to Redis once a second (Publisher); a
// reader merges the replicas' tables (Read). The work is bounded whatever
// the number of tenants: the Tracker names at most MaxTenants tenants per
// window (the others are summed as "other"), a replica publishes at most K
// tenants per ranking (one SET and two sorted-set commands a second), and a
// read is three commands whatever the number of replicas (one MGET).
//
// Counts are exact per replica for the tenants it names; merged, a
// tenant's count sums the replicas whose top tables hold it, so a tenant
// near the bottom of the rankings may be under-counted. Waiting events are
// the deferred events held in the retry consumers' memory (their
// look-ahead), by tenant.
package top
