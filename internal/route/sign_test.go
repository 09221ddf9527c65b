package route

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/segmentio/kafka-go"
)

var (
	testSecret    = []byte("0123456789abcdef0123456789abcdef")
	testPrevious  = []byte("previous-secret-previous-secret!")
	testOtherKeys = []byte("another-secret-another-secret-!!")
)

func newTestSigner(t testing.TB, secret []byte, previous ...[]byte) *Signer {
	t.Helper()
	s, err := NewSigner(secret, previous...)
	if err != nil {
		t.Fatalf("NewSigner: %v", err)
	}
	return s
}

func TestNewSigner(t *testing.T) {
	short := testSecret[:MinSecretBytes-1]
	tests := []struct {
		name     string
		secret   []byte
		previous [][]byte
		wantErr  string
	}{
		{name: "32 bytes", secret: testSecret},
		{name: "with previous", secret: testSecret, previous: [][]byte{testPrevious}},
		{name: "short", secret: short, wantErr: "signer: secret 0 is shorter than 32 bytes"},
		{name: "empty", secret: nil, wantErr: "signer: secret 0 is shorter than 32 bytes"},
		{name: "short previous", secret: testSecret, previous: [][]byte{short}, wantErr: "signer: secret 1 is shorter than 32 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewSigner(tt.secret, tt.previous...)
			got := ""
			if err != nil {
				got = err.Error()
				if strings.Contains(got, string(tt.secret)) && len(tt.secret) > 0 {
					t.Errorf("error %q shows the secret", got)
				}
			}
			if got != tt.wantErr {
				t.Errorf("got error %q, want %q", got, tt.wantErr)
			}
		})
	}
}

func TestSignerVerify(t *testing.T) {
	s := newTestSigner(t, testSecret, testPrevious)
	base := WithDeferral(kafka.Message{Key: []byte("k"), Value: []byte(`{"n":1}`), Headers: hdr("trace", "x")}, testDeferral())
	signed := s.Sign(base)
	sig, _ := LastHeader(signed, HeaderSig)

	// edit returns a copy of signed with its headers changed by f.
	edit := func(f func(hs []kafka.Header) []kafka.Header) kafka.Message {
		m := signed
		m.Headers = f(append([]kafka.Header(nil), signed.Headers...))
		return m
	}
	set := func(name, value string) kafka.Message {
		return edit(func(hs []kafka.Header) []kafka.Header {
			for i := range hs {
				if hs[i].Key == name {
					hs[i].Value = []byte(value)
				}
			}
			return hs
		})
	}
	other := signed
	other.Value = []byte(`{"n":2}`)
	otherKey := signed
	otherKey.Key = []byte("k2")
	nilKey := s.Sign(kafka.Message{Value: []byte("v")})
	nilKey.Key = []byte{}

	tests := []struct {
		name string
		msg  kafka.Message
		want error
	}{
		{name: "signed", msg: signed},
		{name: "signed with the previous key", msg: newTestSigner(t, testPrevious).Sign(base)},
		{name: "nil and empty key alike", msg: nilKey},
		{name: "partition, offset and time not signed", msg: func() kafka.Message {
			m := signed
			m.Partition, m.Offset, m.Time = 3, 99, t0
			return m
		}()},
		{name: "in another retry tier", msg: func() kafka.Message {
			m := signed
			m.Topic = "down.retry.1h"
			return m
		}(), want: ErrSigMismatch},
		{name: "gk-sig moved", msg: edit(func(hs []kafka.Header) []kafka.Header {
			return append([]kafka.Header{hs[len(hs)-1]}, hs[:len(hs)-1]...)
		})},
		{name: "unsigned", msg: base, want: ErrSigMissing},
		{name: "signed with another key", msg: newTestSigner(t, testOtherKeys).Sign(base), want: ErrSigMismatch},
		{name: "gk-reserved later", msg: set(HeaderReserved, "99999999999999"), want: ErrSigMismatch},
		{name: "gk-tenant changed", msg: set(HeaderTenant, "victim"), want: ErrSigMismatch},
		{name: "gk-attempt changed", msg: set(HeaderAttempt, "1"), want: ErrSigMismatch},
		{name: "gk-due changed", msg: set(HeaderDue, "0"), want: ErrSigMismatch},
		{name: "gk-origin-offset changed", msg: set(HeaderOriginOffset, "1"), want: ErrSigMismatch},
		{name: "gk-first-seen changed", msg: set(HeaderFirstSeen, "1"), want: ErrSigMismatch},
		{name: "producer header changed", msg: set("trace", "y"), want: ErrSigMismatch},
		{name: "gk-tenant added last", msg: edit(func(hs []kafka.Header) []kafka.Header {
			return append(hs, kafka.Header{Key: HeaderTenant, Value: []byte("victim")})
		}), want: ErrSigMismatch},
		{name: "gk-tenant added first", msg: edit(func(hs []kafka.Header) []kafka.Header {
			return append([]kafka.Header{{Key: HeaderTenant, Value: []byte("victim")}}, hs...)
		}), want: ErrSigMismatch},
		{name: "header dropped", msg: edit(func(hs []kafka.Header) []kafka.Header { return hs[1:] }), want: ErrSigMismatch},
		{name: "headers swapped", msg: edit(func(hs []kafka.Header) []kafka.Header {
			hs[1], hs[2] = hs[2], hs[1]
			return hs
		}), want: ErrSigMismatch},
		{name: "header name and value shifted", msg: edit(func(hs []kafka.Header) []kafka.Header {
			hs[0] = kafka.Header{Key: "trac", Value: []byte("ex")}
			return hs
		}), want: ErrSigMismatch},
		{name: "onto another value", msg: other, want: ErrSigMismatch},
		{name: "onto another key", msg: otherKey, want: ErrSigMismatch},
		{name: "gk-sig twice", msg: edit(func(hs []kafka.Header) []kafka.Header {
			return append(hs, kafka.Header{Key: HeaderSig, Value: []byte(sig)})
		}), want: ErrSigMismatch},
		{name: "gk-sig empty", msg: set(HeaderSig, ""), want: ErrSigMismatch},
		{name: "gk-sig padded", msg: set(HeaderSig, sig+"="), want: ErrSigMismatch},
		{name: "gk-sig not base64", msg: set(HeaderSig, strings.Repeat("*", len(sig))), want: ErrSigMismatch},
		{name: "gk-sig truncated", msg: set(HeaderSig, sig[:len(sig)-1]), want: ErrSigMismatch},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := s.Verify(tt.msg); !errors.Is(got, tt.want) {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}

func TestSignerSign(t *testing.T) {
	s := newTestSigner(t, testSecret, testPrevious)
	m := kafka.Message{Key: []byte("k"), Value: []byte("v"), Headers: hdr("a", "1", HeaderSig, "stale", "b", "2")}
	orig := view([]kafka.Message{m})
	got := s.Sign(m)
	names := make([]string, len(got.Headers))
	for i, h := range got.Headers {
		names[i] = h.Key
	}
	if want := "a,b," + HeaderSig; strings.Join(names, ",") != want {
		t.Errorf("got headers %v, want %s", names, want)
	}
	sig, _ := LastHeader(got, HeaderSig)
	if len(sig) != 43 || strings.ContainsAny(sig, "+/=") {
		t.Errorf("got gk-sig %q, want 43 characters of unpadded base64url", sig)
	}
	if d := view([]kafka.Message{m}); d[0].Headers[1] != orig[0].Headers[1] {
		t.Error("Sign modified its argument")
	}
	// Signing is deterministic: re-signing a signed event changes nothing.
	if again := s.Sign(got); !bytes.Equal(again.Headers[2].Value, got.Headers[2].Value) {
		t.Errorf("re-signing gave %q, want %q", again.Headers[2].Value, got.Headers[2].Value)
	}
	// Only the current key signs.
	old := newTestSigner(t, testPrevious).Sign(m)
	if resigned := s.Sign(old); newTestSigner(t, testSecret).Verify(resigned) != nil {
		t.Error("an event re-signed by a rotated signer does not verify under the current key alone")
	}
}

// BenchmarkSigner measures signing and verifying a deferred 400-byte event.
func BenchmarkSigner(b *testing.B) {
	s := newTestSigner(b, testSecret, testPrevious)
	m := WithDeferral(kafka.Message{Key: []byte("acme-corp"), Value: bytes.Repeat([]byte("x"), 400), Headers: hdr("trace", "x")}, testDeferral())
	signed := s.Sign(m)
	b.Run("sign", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			s.Sign(m)
		}
	})
	b.Run("verify", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := s.Verify(signed); err != nil {
				b.Fatal(err)
			}
		}
	})
}
