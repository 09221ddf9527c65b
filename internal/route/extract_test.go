package route

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
	"unsafe"

	"github.com/segmentio/kafka-go"
)

func TestParseTenantFrom(t *testing.T) {
	tests := []struct {
		spec    string
		wantErr string // substring; "" means valid
	}{
		{spec: "key"},
		{spec: "header:x-tenant"},
		{spec: "header:a:b"},
		{spec: "json:tenant"},
		{spec: "json:a.b.c"},
		{spec: "", wantErr: `tenant source "": want key`},
		{spec: "Key", wantErr: `tenant source "Key"`},
		{spec: "value", wantErr: `tenant source "value"`},
		{spec: "header:", wantErr: `tenant source "header:": header name is empty`},
		{spec: "json:", wantErr: `tenant source "json:": json path has an empty segment`},
		{spec: "json:a..b", wantErr: `tenant source "json:a..b"`},
		{spec: "json:a.", wantErr: `tenant source "json:a."`},
		{spec: "json:a.\xff", wantErr: `tenant source "json:a.\xff": not valid UTF-8`},
		{spec: "json:a\ufffd", wantErr: "tenant source \"json:a\ufffd\": holds U+FFFD"},
		{spec: "header:t\xff", wantErr: `tenant source "header:t\xff": not valid UTF-8`},
		{spec: "json:ünï.ş"},
	}
	for _, tt := range tests {
		t.Run(tt.spec, func(t *testing.T) {
			e, err := ParseTenantFrom(tt.spec)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("got error %v, want none", err)
				}
				if got := e.String(); got != tt.spec {
					t.Errorf("got String() %q, want %q", got, tt.spec)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("got error %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestTenant(t *testing.T) {
	long := strings.Repeat("x", MaxTenantBytes)
	tests := []struct {
		name    string
		spec    string
		msg     kafka.Message
		want    string
		wantErr string // exact reason
	}{
		{name: "key", spec: "key", msg: kafka.Message{Key: []byte("acme")}, want: "acme"},
		{name: "key missing", spec: "key", msg: kafka.Message{}, wantErr: "no key"},
		{name: "key empty", spec: "key", msg: kafka.Message{Key: []byte{}}, wantErr: "tenant is empty"},
		{name: "key 256 bytes", spec: "key", msg: kafka.Message{Key: []byte(long)}, want: long},
		{name: "key invalid utf-8", spec: "key", msg: kafka.Message{Key: []byte("ac\xffme")}, wantErr: "tenant is not valid UTF-8"},
		{name: "key utf-8", spec: "key", msg: kafka.Message{Key: []byte("ünï")}, want: "ünï"},
		{name: "key 257 bytes", spec: "key", msg: kafka.Message{Key: []byte(long + "x")}, wantErr: "tenant over 256 bytes"},

		{name: "header", spec: "header:t", msg: kafka.Message{Headers: hdr("a", "1", "t", "acme")}, want: "acme"},
		{name: "header repeated", spec: "header:t", msg: kafka.Message{Headers: hdr("t", "acme", "x", "1", "t", "acme")}, want: "acme"},
		{name: "header repeated differently", spec: "header:t", msg: kafka.Message{Headers: hdr("t", "cheap", "t", "victim")}, wantErr: `header "t" appears twice with different values`},
		{name: "header invalid utf-8", spec: "header:t", msg: kafka.Message{Headers: hdr("t", "ac\xffme")}, wantErr: "tenant is not valid UTF-8"},
		{name: "header case sensitive", spec: "header:t", msg: kafka.Message{Headers: hdr("T", "acme")}, wantErr: `no header "t"`},
		{name: "header missing", spec: "header:x", msg: kafka.Message{Key: []byte("k")}, wantErr: `no header "x"`},
		{name: "header empty", spec: "header:t", msg: kafka.Message{Headers: hdr("t", "")}, wantErr: "tenant is empty"},

		{name: "json top", spec: "json:tenant", msg: jsonMsg(`{"tenant":"acme"}`), want: "acme"},
		{name: "json nested", spec: "json:a.b", msg: jsonMsg(`{"x":[1,{"b":"no"}],"a":{"y":{"b":"deep"},"b":"acme"}}`), want: "acme"},
		{name: "json skips big values", spec: "json:t", msg: jsonMsg(`{"pad":{"a":[1,2,{"c":null}],"s":"\"}"},"t":"acme"}`), want: "acme"},
		{name: "json number", spec: "json:id", msg: jsonMsg(`{"id": 12345}`), want: "12345"},
		{name: "json negative number", spec: "json:id", msg: jsonMsg(`{"id":-7}`), want: "-7"},
		{name: "json zero", spec: "json:id", msg: jsonMsg(`{"id":0}`), want: "0"},
		{name: "json largest safe integer", spec: "json:id", msg: jsonMsg(`{"id":9007199254740991}`), want: "9007199254740991"},
		{name: "json smallest safe integer", spec: "json:id", msg: jsonMsg(`{"id":-9007199254740991}`), want: "-9007199254740991"},
		{name: "json number exponent", spec: "json:id", msg: jsonMsg(`{"id":1e2}`), wantErr: `json path "id" is not a string or an integer in plain decimal up to 2^53-1`},
		{name: "json number upper exponent", spec: "json:id", msg: jsonMsg(`{"id":1E2}`), wantErr: `json path "id" is not a string or an integer in plain decimal up to 2^53-1`},
		{name: "json number fraction", spec: "json:id", msg: jsonMsg(`{"id":100.0}`), wantErr: `json path "id" is not a string or an integer in plain decimal up to 2^53-1`},
		{name: "json number literal", spec: "json:id", msg: jsonMsg(`{"id":1.50e3}`), wantErr: `json path "id" is not a string or an integer in plain decimal up to 2^53-1`},
		{name: "json negative zero", spec: "json:id", msg: jsonMsg(`{"id":-0}`), wantErr: `json path "id" is not a string or an integer in plain decimal up to 2^53-1`},
		{name: "json number beyond 2^53-1", spec: "json:id", msg: jsonMsg(`{"id":9007199254740992}`), wantErr: `json path "id" is not a string or an integer in plain decimal up to 2^53-1`},
		{name: "json number below -(2^53-1)", spec: "json:id", msg: jsonMsg(`{"id":-9007199254740992}`), wantErr: `json path "id" is not a string or an integer in plain decimal up to 2^53-1`},
		{name: "json huge number", spec: "json:id", msg: jsonMsg(`{"id":` + strings.Repeat("9", 400) + `}`), wantErr: `json path "id" is not a string or an integer in plain decimal up to 2^53-1`},
		{name: "json escaped string", spec: "json:t", msg: jsonMsg(`{"t":"a\u00e9\"b"}`), want: "aé\"b"},
		{name: "json escaped key", spec: "json:t", msg: jsonMsg(`{"\u0074":"acme"}`), want: "acme"},
		{name: "json surrogate pair", spec: "json:t", msg: jsonMsg(`{"t":"\ud83d\ude00"}`), want: "\U0001F600"},
		{name: "json duplicate", spec: "json:tenant", msg: jsonMsg(`{"tenant":"cheap","tenant":"victim"}`), wantErr: `json path "tenant": key "tenant" appears twice`},
		{name: "json duplicate same value", spec: "json:t", msg: jsonMsg(`{"t":"acme","t":"acme"}`), wantErr: `json path "t": key "t" appears twice`},
		{name: "json duplicate escaped", spec: "json:t", msg: jsonMsg(`{"t":"cheap","\u0074":"victim"}`), wantErr: `json path "t": key "t" appears twice`},
		{name: "json duplicate far after", spec: "json:t", msg: jsonMsg(`{"t":"cheap","pad":[{"t":1}],"x":{"t":2},"t":"victim"}`), wantErr: `json path "t": key "t" appears twice`},
		{name: "json duplicate outer", spec: "json:a.b", msg: jsonMsg(`{"a":{"b":"cheap"},"a":{"b":"victim"}}`), wantErr: `json path "a.b": key "a" appears twice`},
		{name: "json duplicate outer not object", spec: "json:a.b", msg: jsonMsg(`{"a":{"b":"cheap"},"a":"x"}`), wantErr: `json path "a.b": key "a" appears twice`},
		{name: "json duplicate inner", spec: "json:a.b", msg: jsonMsg(`{"a":{"b":"cheap","c":1,"b":"victim"}}`), wantErr: `json path "a.b": key "b" appears twice`},
		{name: "json duplicate off the path", spec: "json:a.b", msg: jsonMsg(`{"x":1,"x":2,"a":{"b":"acme","y":{"b":1,"b":2}}}`), want: "acme"},
		{name: "json case only", spec: "json:tenant", msg: jsonMsg(`{"TENANT":"victim"}`), wantErr: `json path "tenant": key "TENANT" differs from "tenant" only in case`},
		{name: "json case after exact", spec: "json:tenant", msg: jsonMsg(`{"tenant":"cheap","Tenant":"victim"}`), wantErr: `json path "tenant": key "Tenant" differs from "tenant" only in case`},
		{name: "json case before exact", spec: "json:tenant", msg: jsonMsg(`{"tenanT":"victim","tenant":"cheap"}`), wantErr: `json path "tenant": key "tenanT" differs from "tenant" only in case`},
		{name: "json case outer", spec: "json:a.b", msg: jsonMsg(`{"A":{"b":"victim"},"a":{"b":"cheap"}}`), wantErr: `json path "a.b": key "A" differs from "a" only in case`},
		{name: "json case kelvin sign", spec: "json:kind", msg: jsonMsg(`{"kind":"cheap","\u212aind":"victim"}`), wantErr: `json path "kind": key "\u212aind" differs from "kind" only in case`},
		{name: "json case long s", spec: "json:s", msg: jsonMsg(`{"s":"cheap","\u017f":"victim"}`), wantErr: `json path "s": key "\u017f" differs from "s" only in case`},
		{name: "json invalid utf-8", spec: "json:t", msg: jsonMsg("{\"t\":\"ac\xffme\"}"), wantErr: "tenant is not valid UTF-8"},
		{name: "json lone surrogate", spec: "json:t", msg: jsonMsg(`{"t":"acme\ud800"}`), wantErr: `json path "t" holds an unpaired surrogate escape`},
		{name: "json lone low surrogate", spec: "json:t", msg: jsonMsg(`{"t":"\udc00acme"}`), wantErr: `json path "t" holds an unpaired surrogate escape`},
		{name: "json surrogate then escape", spec: "json:t", msg: jsonMsg(`{"t":"\ud800\u0041"}`), wantErr: `json path "t" holds an unpaired surrogate escape`},
		{name: "json invalid utf-8 elsewhere", spec: "json:t", msg: jsonMsg("{\"n\xff\":\"\xfe\",\"t\":\"acme\"}"), want: "acme"},
		{name: "json escapes", spec: "json:t", msg: jsonMsg(`{"t":"a\/b\\c\n\t\b\f\r\u0000"}`), want: "a/b\\c\n\t\b\f\r\x00"},
		{name: "json broken after the field", spec: "json:t", msg: jsonMsg(`{"t":"acme", garbage`), wantErr: "bad json: invalid character 'g' looking for beginning of object key string"},
		{name: "json truncated after the field", spec: "json:t", msg: jsonMsg(`{"t":{"id":"acme"`), wantErr: "bad json: unexpected end of JSON input"},
		{name: "json whitespace", spec: "json:a.b", msg: jsonMsg(" \n{ \"a\" : { \"b\" : \"acme\" } } "), want: "acme"},

		{name: "json empty value", spec: "json:t", msg: jsonMsg(``), wantErr: "bad json: unexpected end of JSON input"},
		{name: "json truncated", spec: "json:t", msg: jsonMsg(`{"a":1,`), wantErr: "bad json: unexpected end of JSON input"},
		{name: "json not json", spec: "json:t", msg: jsonMsg(`hello`), wantErr: "bad json: invalid character 'h' looking for beginning of value"},
		{name: "json bad before path", spec: "json:t", msg: jsonMsg(`{"a":tru,"t":"x"}`), wantErr: "bad json: invalid character ',' in literal true (expecting 'e')"},
		{name: "json missing comma", spec: "json:t", msg: jsonMsg(`{"a":1 "t":"x"}`), wantErr: "bad json: invalid character '\"' after object key:value pair"},
		{name: "json bad after missing path", spec: "json:t", msg: jsonMsg(`{"a":1}}`), wantErr: `bad json: invalid character '}' after top-level value`},
		{name: "json missing", spec: "json:t", msg: jsonMsg(`{"a":"acme"}`), wantErr: `json path "t" not found`},
		{name: "json missing nested", spec: "json:a.b", msg: jsonMsg(`{"a":{"c":"acme"}}`), wantErr: `json path "a.b" not found`},
		{name: "json intermediate not object", spec: "json:a.b", msg: jsonMsg(`{"a":"acme"}`), wantErr: `json path "a.b" not found`},
		{name: "json intermediate array", spec: "json:a.b", msg: jsonMsg(`{"a":[{"b":"x"}]}`), wantErr: `json path "a.b" not found`},
		{name: "json top array", spec: "json:t", msg: jsonMsg(`[{"t":"x"}]`), wantErr: `json path "t" not found`},
		{name: "json top string", spec: "json:t", msg: jsonMsg(`"t"`), wantErr: `json path "t" not found`},
		{name: "json object value", spec: "json:a", msg: jsonMsg(`{"a":{"b":1}}`), wantErr: `json path "a" is not a string or number`},
		{name: "json array value", spec: "json:a", msg: jsonMsg(`{"a":[1]}`), wantErr: `json path "a" is not a string or number`},
		{name: "json bool value", spec: "json:a.b", msg: jsonMsg(`{"a":{"b":true}}`), wantErr: `json path "a.b" is not a string or number`},
		{name: "json null value", spec: "json:a", msg: jsonMsg(`{"a":null}`), wantErr: `json path "a" is not a string or number`},
		{name: "json empty string", spec: "json:a", msg: jsonMsg(`{"a":""}`), wantErr: "tenant is empty"},
		{name: "json long string", spec: "json:a", msg: jsonMsg(`{"a":"` + long + `y"}`), wantErr: "tenant over 256 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, err := ParseTenantFrom(tt.spec)
			if err != nil {
				t.Fatalf("ParseTenantFrom(%q): %v", tt.spec, err)
			}
			// Tenant, then the Gate's tenantIn twice in one batch: the
			// second time the tenant's bytes were seen (when valid).
			seen := batchTenants{}
			for _, how := range []string{"Tenant", "tenantIn", "tenantIn again"} {
				got, err := e.Tenant(tt.msg)
				if how != "Tenant" {
					got, err = e.tenantIn(tt.msg, seen)
				}
				if tt.wantErr != "" {
					if err == nil {
						t.Fatalf("%s: got tenant %q, want error %q", how, got, tt.wantErr)
					}
					if err.Error() != tt.wantErr {
						t.Fatalf("%s: got error %q, want %q", how, err.Error(), tt.wantErr)
					}
					continue
				}
				if err != nil {
					t.Fatalf("%s: got error %q, want tenant %q", how, err, tt.want)
				}
				if got != tt.want {
					t.Errorf("%s: got tenant %q, want %q", how, got, tt.want)
				}
			}
		})
	}
}

func jsonMsg(v string) kafka.Message { return kafka.Message{Value: []byte(v)} }

// A batch's events of one tenant share one string, made once, and a tenant
// seen valid does not make a later event's bad header pass.
func TestTenantInBatch(t *testing.T) {
	e, err := ParseTenantFrom("header:t")
	if err != nil {
		t.Fatal(err)
	}
	seen := batchTenants{}
	first, err := e.tenantIn(kafka.Message{Headers: hdr("t", "acme")}, seen)
	if err != nil {
		t.Fatal(err)
	}
	msg := kafka.Message{Headers: hdr("x", "1", "t", "acme")}
	if allocs := testing.AllocsPerRun(20, func() {
		got, err := e.tenantIn(msg, seen)
		if err != nil || got != first || unsafe.StringData(got) != unsafe.StringData(first) {
			t.Fatalf("got %q %v, want the batch's string %q", got, err, first)
		}
	}); allocs != 0 {
		t.Errorf("a tenant seen in the batch: got %.0f allocations, want 0", allocs)
	}
	if got, err := e.tenantIn(kafka.Message{Headers: hdr("t", "acme", "t", "victim")}, seen); err == nil {
		t.Errorf("header twice, the first value seen: got tenant %q, want an error", got)
	}
}

// FuzzTenant checks that Tenant never panics, that a tenant it returns is
// non-empty, at most MaxTenantBytes and valid UTF-8, that valid JSON is never
// called bad, and that a JSON tenant is what encoding/json reads at the path.
// The seed corpus is in testdata/fuzz/FuzzTenant.
func FuzzTenant(f *testing.F) {
	f.Add("json:a.b", []byte("k"), []byte("h"), []byte(`{"a":{"b":"acme"}}`))
	f.Add("json:a.b", []byte("k"), []byte("h"), []byte(`{"a":{"b":"x"},"A":{"b":"y"},"a":{"b":1e2}}`))
	f.Add("json:t", []byte("k"), []byte("h"), []byte(`{"t":"\ud800\udc00\u00e9","\u0074":-0}`))
	f.Fuzz(func(t *testing.T, spec string, key, header, value []byte) {
		e, err := ParseTenantFrom(spec)
		if err != nil {
			return
		}
		m := kafka.Message{Key: key, Value: value, Headers: []kafka.Header{{Key: "t", Value: header}}}
		if len(key) == 0 {
			m.Key = nil
		}
		tenant, err := e.Tenant(m)
		if err != nil {
			if tenant != "" {
				t.Errorf("got tenant %q with error %v, want none", tenant, err)
			}
			if err.Error() == "" {
				t.Error("got an empty reason")
			}
			if strings.HasPrefix(err.Error(), "bad json") && json.Valid(value) {
				t.Errorf("got %q for valid JSON %q", err, value)
			}
			return
		}
		if tenant == "" || len(tenant) > MaxTenantBytes || !utf8.ValidString(tenant) {
			t.Errorf("got tenant %q, want 1..%d bytes of UTF-8", tenant, MaxTenantBytes)
		}
		if e.source == fromJSON {
			if got := goJSONTenant(t, value, e.path); got != tenant {
				t.Errorf("got tenant %q, encoding/json reads %q", tenant, got)
			}
		}
	})
}

// goJSONTenant returns what encoding/json reads at path in value, as a
// tenant: a string, or a number in its shortest decimal form.
func goJSONTenant(t *testing.T, value []byte, path []string) string {
	var v any
	if err := json.Unmarshal(value, &v); err != nil {
		t.Fatalf("encoding/json: %v", err)
	}
	for _, p := range path {
		obj, ok := v.(map[string]any)
		if !ok {
			t.Fatalf("encoding/json: no object at %q", p)
		}
		v = obj[p]
	}
	switch x := v.(type) {
	case string:
		return x
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64)
	}
	t.Fatalf("encoding/json: got %T at the path", v)
	return ""
}

// BenchmarkTenant measures Tenant per event for each source, on an event of
// about 400 bytes whose tenant field sits between other fields (MB/s for the
// JSON sources only).
func BenchmarkTenant(b *testing.B) {
	value := []byte(`{"id":"evt-000123456","type":"order.created","ts":1741082400123,` +
		`"meta":{"source":"web","region":"eu-west-1","tenant":"acme-corp","trace":"4bf92f3577b34da6a3ce929d0e0e4736"},` +
		`"tenant":"acme-corp","payload":{"order":{"id":98765,"items":[{"sku":"A-1","qty":2,"price":19.99},` +
		`{"sku":"B-22","qty":1,"price":5.5}],"note":"leave at the door, ring twice \"please\""},"total":45.48}}`)
	msg := kafka.Message{Key: []byte("acme-corp"), Value: value, Headers: hdr("trace", "x", "tenant", "acme-corp")}
	for _, bc := range []struct{ name, spec string }{
		{"key", "key"},
		{"header", "header:tenant"},
		{"json", "json:tenant"},
		{"json_nested", "json:meta.tenant"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			e, err := ParseTenantFrom(bc.spec)
			if err != nil {
				b.Fatal(err)
			}
			if strings.HasPrefix(bc.spec, "json:") {
				b.SetBytes(int64(len(value)))
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := e.Tenant(msg); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
