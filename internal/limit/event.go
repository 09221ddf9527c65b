package limit

import "time"

// Event is one event of a batch as the limiter decides it: its tenant, what
// it costs, and its position in the batch's source partition. It is a value
// type.
type Event struct {
	// Tenant is whose limits the event counts against.
	Tenant string
	// Cost is what the event costs the rules that count bytes or units; a
	// rule that counts events counts 1 an event.
	Cost Cost
	// Offset is the event's offset in the Source's partition; it is read
	// only when the batch names a Source.
	Offset int64
	// InSlot: the event came back from the first retry tier inside its
	// reserved slot (AdmitLate): it keeps the slot unless a late event of
	// its tenant took it.
	InSlot bool
	// Due is, for an InSlot event, its gk-due: the start of the slot it
	// claims, whose takes it reads (admit/85_late.lua). The zero time reads
	// only the takes of the tenant's finest window that holds now.
	Due time.Time
}

// Tenants returns the tenants of events, index-aligned with them.
func Tenants(events []Event) []string {
	tenants := make([]string, len(events))
	for i, e := range events {
		tenants[i] = e.Tenant
	}
	return tenants
}
