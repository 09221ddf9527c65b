package route

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/segmentio/kafka-go"
)

// MaxTenantBytes is the longest tenant accepted, in bytes.
const MaxTenantBytes = 256

// maxSafeInteger is the largest integer every JSON reader gets exactly,
// JavaScript's included (2^53-1).
const maxSafeInteger = 1<<53 - 1

type tenantSource uint8

const (
	fromKey tenantSource = iota + 1
	fromHeader
	fromJSON
)

// Extractor derives the tenant of an event from its key, one of its headers,
// or a field of its JSON value, as configured by GATEKEEPER_TENANT_FROM.
//
// An Extractor is immutable and safe for concurrent use.
type Extractor struct {
	spec   string
	source tenantSource
	header string   // for fromHeader
	path   []string // for fromJSON
	segs   [][]byte // for fromJSON: path as bytes, for case-insensitive matching
	dotted string   // for fromJSON: the path as written, for reasons
	// number: the field is a cost, a JSON number returned as written (see
	// CostFrom), not a tenant.
	number bool
}

// ParseTenantFrom parses a tenant source: "key", "header:<name>" or
// "json:<dot.path>" (for example "json:customer.id"). A header name or path
// must be valid UTF-8 without U+FFFD, the character that readers put in
// place of bytes that are not UTF-8. The error names the spec it could not
// parse.
func ParseTenantFrom(spec string) (*Extractor, error) {
	e := &Extractor{spec: spec}
	switch {
	case spec == "key":
		e.source = fromKey
	case strings.HasPrefix(spec, "header:"):
		e.source = fromHeader
		e.header = strings.TrimPrefix(spec, "header:")
		if e.header == "" {
			return nil, fmt.Errorf("tenant source %q: header name is empty", spec)
		}
	case strings.HasPrefix(spec, "json:"):
		e.source = fromJSON
		e.dotted = strings.TrimPrefix(spec, "json:")
		e.path = strings.Split(e.dotted, ".")
		for _, p := range e.path {
			if p == "" {
				return nil, fmt.Errorf("tenant source %q: json path has an empty segment", spec)
			}
			e.segs = append(e.segs, []byte(p))
		}
	default:
		return nil, fmt.Errorf("tenant source %q: want key, header:<name> or json:<dot.path>", spec)
	}
	switch name := strings.TrimPrefix(strings.TrimPrefix(spec, "header:"), "json:"); {
	case !utf8.ValidString(name):
		return nil, fmt.Errorf("tenant source %q: not valid UTF-8", spec)
	case strings.ContainsRune(name, utf8.RuneError):
		return nil, fmt.Errorf("tenant source %q: holds U+FFFD", spec)
	}
	return e, nil
}

// String returns the spec the Extractor was parsed from.
func (e *Extractor) String() string { return e.spec }

// Tenant returns the tenant of m. A non-nil error means the event is invalid;
// its text is short and meant as the dead-letter reason, for example
// `no key`, `no header "x"`, `bad json: ...`, `json path "a.b" not found`,
// `json path "a.b": key "a" appears twice`, `tenant is empty`,
// `tenant over 256 bytes` or `tenant is not valid UTF-8`.
//
// The rules make every reader of the event agree on its tenant: whatever
// Gatekeeper counts is what a consumer downstream reads, in Go, JavaScript
// or Java. So a tenant must be valid UTF-8 (readers replace other bytes with
// U+FFFD, folding distinct tenants into one), and a source that could be read
// two ways makes the event invalid:
//
//   - A header source: the header's value; if the header appears more than
//     once, every value must be the same (a reader may take the first or the
//     last).
//   - A JSON source: the value must be valid JSON (checked with json.Valid,
//     which builds nothing, so a truncated event is dead-lettered even when
//     its tenant comes first) and an object; the path is followed through
//     nested objects. In each object on the path, the path's key must appear
//     once (JavaScript and Go take the last of duplicate keys), and no other
//     key may equal it but for case (encoding/json matches struct fields
//     that way, with bytes.EqualFold). The field may hold a string, which
//     must not hold an escaped surrogate that is not part of a pair, or an
//     integer from -(2^53-1) to 2^53-1 written in plain decimal: its text is
//     the tenant, so {"id":100} and {"id":"100"} are one tenant. Other
//     numbers (1e2, 100.0, -0, 2^53) are invalid: readers disagree on their
//     text or value.
func (e *Extractor) Tenant(m kafka.Message) (string, error) {
	var tenant string
	switch e.source {
	case fromKey:
		if m.Key == nil {
			return "", errors.New("no key")
		}
		tenant = string(m.Key)
	case fromHeader:
		t, err := e.headerTenant(m.Headers)
		if err != nil {
			return "", err
		}
		tenant = t
	case fromJSON:
		t, err := e.jsonTenant(m.Value)
		if err != nil {
			return "", err
		}
		tenant = t
	default:
		return "", errors.New("extractor not configured")
	}
	if err := checkTenant(tenant); err != nil {
		return "", err
	}
	return tenant, nil
}

// batchTenants interns the tenants of one batch (Gate.extract): an event
// whose tenant's bytes came earlier in the batch gets the same string,
// checked once, without an allocation (10,000 Zipf tenants: about half the
// events of a 500-event batch repeat a tenant). It holds at most one
// batch's tenants. Not safe for concurrent use.
type batchTenants map[string]string

var batchTenantsPool = sync.Pool{New: func() any { return batchTenants{} }}

// release empties bt and gives it to the next batch.
func (bt batchTenants) release() {
	clear(bt)
	batchTenantsPool.Put(bt)
}

// tenantIn is Tenant, the tenant interned in seen when it comes from the
// key or a header (a tenant in the JSON value is not).
func (e *Extractor) tenantIn(m kafka.Message, seen batchTenants) (string, error) {
	var raw []byte
	switch e.source {
	case fromKey:
		raw = m.Key
	case fromHeader:
		for _, h := range m.Headers {
			if h.Key == e.header {
				if raw != nil {
					return e.Tenant(m) // the header twice: Tenant says whether that is wrong
				}
				raw = h.Value
			}
		}
	}
	if raw == nil {
		return e.Tenant(m)
	}
	if t, ok := seen[string(raw)]; ok {
		return t, nil
	}
	t, err := e.Tenant(m)
	if err == nil {
		seen[t] = t
	}
	return t, err
}

func checkTenant(t string) error {
	switch {
	case t == "":
		return errors.New("tenant is empty")
	case len(t) > MaxTenantBytes:
		return fmt.Errorf("tenant over %d bytes", MaxTenantBytes)
	case !utf8.ValidString(t):
		return errors.New("tenant is not valid UTF-8")
	}
	return nil
}

// headerTenant returns the value of the header e.header, which must be the
// same in every header of that name.
func (e *Extractor) headerTenant(hs []kafka.Header) (string, error) {
	var v []byte
	found := false
	for _, h := range hs {
		if h.Key != e.header {
			continue
		}
		if found && !bytes.Equal(h.Value, v) {
			return "", fmt.Errorf("header %q appears twice with different values", e.header)
		}
		v, found = h.Value, true
	}
	if !found {
		return "", fmt.Errorf("no header %q", e.header)
	}
	return string(v), nil
}

// jsonTenant reads the tenant at e.path in value.
func (e *Extractor) jsonTenant(value []byte) (string, error) {
	if !json.Valid(value) {
		// Let the decoder say where: it names the first syntax error.
		var v any
		if err := json.Unmarshal(value, &v); err != nil {
			return "", badJSON(err)
		}
		return "", badJSON(errors.New("invalid JSON"))
	}
	return e.object(&jsonText{b: value}, 0)
}

// object reads the object that starts at the next non-space byte of s to its
// end, and returns the tenant found under it at e.path[depth:].
func (e *Extractor) object(s *jsonText, depth int) (string, error) {
	if s.next() != '{' {
		return "", fmt.Errorf("json path %q not found", e.dotted)
	}
	s.i++
	var tenant string
	found := false
	for {
		switch s.next() {
		case '}':
			s.i++
			if !found {
				return "", fmt.Errorf("json path %q not found", e.dotted)
			}
			return tenant, nil
		case ',':
			s.i++
			continue
		case '"':
		default: // not on text that json.Valid accepted
			return "", badJSON(fmt.Errorf("unexpected input at byte %d", s.i))
		}
		key, escaped := s.str()
		s.next()
		s.i++ // the colon
		match, err := e.keyMatches(key, escaped, depth)
		if err != nil {
			return "", err
		}
		if !match {
			s.skip()
			continue
		}
		if found {
			return "", fmt.Errorf("json path %q: key %+q appears twice", e.dotted, e.path[depth])
		}
		found = true
		if depth < len(e.path)-1 {
			tenant, err = e.object(s, depth+1)
		} else {
			tenant, err = e.leaf(s)
		}
		if err != nil {
			return "", err
		}
	}
}

// keyMatches reports whether an object key (raw, as jsonText.str returns it)
// is the path's key at depth. A key equal to it but for case is an error.
func (e *Extractor) keyMatches(raw []byte, escaped bool, depth int) (bool, error) {
	key := raw
	if escaped {
		key, _ = unquote(raw)
	}
	want := e.segs[depth]
	if bytes.Equal(key, want) {
		return true, nil
	}
	if bytes.EqualFold(key, want) {
		return false, fmt.Errorf("json path %q: key %+q differs from %q only in case", e.dotted, key, want)
	}
	return false, nil
}

// leaf reads the tenant field's value, which starts at the next non-space
// byte of s; or, for a cost (e.number), the number it holds as written.
func (e *Extractor) leaf(s *jsonText) (string, error) {
	if e.number {
		if c := s.next(); c != '-' && (c < '0' || c > '9') {
			return "", fmt.Errorf("json path %q is not a number", e.dotted)
		}
		return string(s.literal()), nil
	}
	switch c := s.next(); {
	case c == '"':
		raw, escaped := s.str()
		// Undecoded, a tenant may be up to six times longer (\u0041 is "A");
		// longer ones are refused before anything is built.
		if limit := MaxTenantBytes; len(raw) > limit && (!escaped || len(raw) > 6*limit) {
			return "", fmt.Errorf("tenant over %d bytes", MaxTenantBytes)
		}
		if !escaped {
			return string(raw), nil
		}
		t, lone := unquote(raw)
		if lone {
			return "", fmt.Errorf("json path %q holds an unpaired surrogate escape", e.dotted)
		}
		return string(t), nil
	case c == '-' || '0' <= c && c <= '9':
		num := s.literal()
		if !safeInteger(num) {
			return "", fmt.Errorf("json path %q is not a string or an integer in plain decimal up to 2^53-1", e.dotted)
		}
		return string(num), nil
	}
	return "", fmt.Errorf("json path %q is not a string or number", e.dotted)
}

// safeInteger reports whether num, a JSON number, is an integer written in
// plain decimal (no fraction, exponent or leading zero, not -0) from
// -(2^53-1) to 2^53-1: the numbers every reader gets exactly and writes back
// the same way.
func safeInteger(num []byte) bool {
	digits := num
	if len(digits) > 0 && digits[0] == '-' {
		digits = digits[1:]
	}
	if len(digits) == 0 || len(digits) > 16 || digits[0] == '0' && len(num) > 1 {
		return false
	}
	var n int64
	for _, c := range digits {
		if c < '0' || c > '9' {
			return false
		}
		n = n*10 + int64(c-'0')
	}
	return n <= maxSafeInteger
}

func badJSON(err error) error {
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return fmt.Errorf("bad json: %w", err)
}
