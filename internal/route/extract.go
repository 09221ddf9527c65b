package route

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/segmentio/kafka-go"
)

// MaxTenantBytes is the longest tenant accepted, in bytes.
const MaxTenantBytes = 256

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
	dotted string   // for fromJSON: the path as written, for reasons
}

// ParseTenantFrom parses a tenant source: "key", "header:<name>" or
// "json:<dot.path>" (for example "json:customer.id"). The error names the
// spec it could not parse.
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
		}
	default:
		return nil, fmt.Errorf("tenant source %q: want key, header:<name> or json:<dot.path>", spec)
	}
	return e, nil
}

// String returns the spec the Extractor was parsed from.
func (e *Extractor) String() string { return e.spec }

// Tenant returns the tenant of m. A non-nil error means the event is invalid;
// its text is short and meant as the dead-letter reason, for example
// `no key`, `no header "x"`, `bad json: ...`, `json path "a.b" not found`,
// `json path "a.b" is not a string or number`, `tenant is empty` or
// `tenant over 256 bytes`.
//
// For a header source the last header of that name counts, as with Kafka's
// lastHeader. For a JSON source the value must be an object; the path is
// followed through nested objects, and the field may hold a string or a
// number, whose literal text is the tenant. The whole value must be valid
// JSON (json.Valid scans it without building anything), so a truncated event
// is dead-lettered even when its tenant comes first; then it is read as a
// token stream up to the field: other fields are skipped without being
// decoded. If an object has the same key twice, the first one counts.
func (e *Extractor) Tenant(m kafka.Message) (string, error) {
	var tenant string
	switch e.source {
	case fromKey:
		if m.Key == nil {
			return "", errors.New("no key")
		}
		tenant = string(m.Key)
	case fromHeader:
		found := false
		for _, h := range m.Headers {
			if h.Key == e.header {
				tenant, found = string(h.Value), true
			}
		}
		if !found {
			return "", fmt.Errorf("no header %q", e.header)
		}
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

func checkTenant(t string) error {
	if t == "" {
		return errors.New("tenant is empty")
	}
	if len(t) > MaxTenantBytes {
		return fmt.Errorf("tenant over %d bytes", MaxTenantBytes)
	}
	return nil
}

// jsonTenant walks the token stream of value down e.path.
func (e *Extractor) jsonTenant(value []byte) (string, error) {
	if !json.Valid(value) {
		// Let the decoder say where: it names the first syntax error.
		var v any
		if err := json.Unmarshal(value, &v); err != nil {
			return "", badJSON(err)
		}
		return "", badJSON(errors.New("invalid JSON"))
	}
	dec := json.NewDecoder(bytes.NewReader(value))
	dec.UseNumber()
	notFound := fmt.Errorf("json path %q not found", e.dotted)

	var skip json.RawMessage // reused buffer for skipped values
	for depth, want := range e.path {
		// The value at this level must be an object.
		tok, err := dec.Token()
		if err != nil {
			return "", badJSON(err)
		}
		if tok != json.Delim('{') {
			return "", notFound
		}
		for {
			if !dec.More() {
				// Read the closing brace so that syntax errors win over "not found".
				if _, err := dec.Token(); err != nil {
					return "", badJSON(err)
				}
				return "", notFound
			}
			tok, err := dec.Token()
			if err != nil {
				return "", badJSON(err)
			}
			key, ok := tok.(string)
			if !ok {
				return "", badJSON(fmt.Errorf("object key is %v", tok))
			}
			if key == want {
				break
			}
			if err := dec.Decode(&skip); err != nil {
				return "", badJSON(err)
			}
		}
		if depth < len(e.path)-1 {
			continue // the next iteration reads the nested object
		}
		tok, err = dec.Token()
		if err != nil {
			return "", badJSON(err)
		}
		switch v := tok.(type) {
		case string:
			return v, nil
		case json.Number:
			return v.String(), nil
		default:
			return "", fmt.Errorf("json path %q is not a string or number", e.dotted)
		}
	}
	return "", notFound // unreachable: e.path is never empty
}

func badJSON(err error) error {
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return fmt.Errorf("bad json: %w", err)
}
