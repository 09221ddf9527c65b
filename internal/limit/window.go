package limit

import "time"

// WindowKind says how a rule's windows are placed in time.
type WindowKind string

// The window kinds of WINDOW.
const (
	// Aligned windows sit on calendar boundaries in a time zone.
	Aligned WindowKind = "aligned"
	// TTL windows start at a tenant's first event and last the rule's length.
	TTL WindowKind = "ttl"
)

// alignedStart returns the start of the aligned window of r that holds t, in loc.
// Weeks start on Monday; days, weeks and months start at local midnight, so a
// day lasts 23 or 25 hours across a daylight-saving change.
func alignedStart(r Rule, t time.Time, loc *time.Location) time.Time {
	lt := t.In(loc)
	y, mo, d := lt.Date()
	switch r.Unit {
	case Second, Minute:
		// Zone offsets are whole minutes: tile from the local minute or hour.
		step := r.Length()
		base := time.Date(y, mo, d, lt.Hour(), 0, 0, 0, loc)
		if base.After(t) { // an hour that repeats or is skipped at a DST change
			base = t.Truncate(time.Hour)
		}
		return base.Add(t.Sub(base) / step * step)
	case Hour:
		h := lt.Hour() - lt.Hour()%r.Count
		s := time.Date(y, mo, d, h, 0, 0, 0, loc)
		if s.After(t) || !t.Before(alignedEnd(r, s, loc)) {
			// Around a DST change the local hour is ambiguous; fall back to
			// absolute hours, exact for every zone with whole-hour offsets.
			s = t.Truncate(time.Duration(r.Count) * time.Hour)
		}
		return s
	case Day:
		return time.Date(y, mo, d, 0, 0, 0, 0, loc)
	case Week:
		back := (int(lt.Weekday()) + 6) % 7 // days since Monday
		return time.Date(y, mo, d-back, 0, 0, 0, 0, loc)
	case Month:
		m := int(mo) - (int(mo)-1)%r.Count
		return time.Date(y, time.Month(m), 1, 0, 0, 0, 0, loc)
	}
	panic("limit: unknown unit")
}

// alignedEnd returns the end of the aligned window of r that starts at s.
func alignedEnd(r Rule, s time.Time, loc *time.Location) time.Time {
	ls := s.In(loc)
	y, mo, d := ls.Date()
	switch r.Unit {
	case Second, Minute:
		return s.Add(r.Length())
	case Hour:
		if r.Count == 1 {
			// Absolute hours: exact for whole-hour offsets, and the local hour
			// is ambiguous when a DST change repeats it.
			return s.Add(time.Hour)
		}
		e := time.Date(y, mo, d, ls.Hour()+r.Count, 0, 0, 0, loc)
		if !e.After(s) {
			e = s.Add(r.Length())
		}
		return e
	case Day:
		return time.Date(y, mo, d+1, 0, 0, 0, 0, loc)
	case Week:
		return time.Date(y, mo, d+7, 0, 0, 0, 0, loc)
	case Month:
		return time.Date(y, mo+time.Month(r.Count), 1, 0, 0, 0, 0, loc)
	}
	panic("limit: unknown unit")
}

// WindowBounds returns the aligned window [start, end) of r that holds t in loc.
func WindowBounds(r Rule, t time.Time, loc *time.Location) (start, end time.Time) {
	s := alignedStart(r, t, loc)
	return s, alignedEnd(r, s, loc)
}

// boundaries lists window starts of r from the window holding now up to and
// including the first boundary after until.
func boundaries(r Rule, now, until time.Time, loc *time.Location) []time.Time {
	s, e := WindowBounds(r, now, loc)
	out := []time.Time{s, e}
	for !e.After(until) {
		e = alignedEnd(r, e, loc)
		out = append(out, e)
	}
	return out
}
