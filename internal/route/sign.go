package route

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/segmentio/kafka-go"
)

// MinSecretBytes is the shortest key a Signer accepts: as long as the
// HMAC-SHA256 output.
const MinSecretBytes = 32

// The reasons, and errors, of an event in a retry tier that fails verification.
var (
	// ErrSigMissing means the event carries no gk-sig header.
	ErrSigMissing = errors.New(HeaderSig + " missing")
	// ErrSigMismatch means gk-sig is not the event's signature under any key
	// (or appears more than once): its gk- headers, key, value or other
	// headers were written or changed by someone else.
	ErrSigMismatch = errors.New(HeaderSig + " does not match")
)

// sigDomain starts every signed message, so that a signature of this format
// cannot be taken for any other use of the key. It changes with the format.
const sigDomain = "gatekeeper gk-sig v1\x00"

// Signer signs the events Gatekeeper writes to the retry tiers and verifies
// the events it reads back, so that whoever can write a retry topic cannot
// forge gk- headers: a far gk-reserved (forwarded uncounted), another
// tenant's gk-tenant, or a signed header set moved onto another event.
//
// gk-sig is the unpadded base64url HMAC-SHA256 of the event's key, its
// headers other than gk-sig (names and values, in order: the gk- deferral
// headers and the producer's own) and its value, each length-prefixed, under
// the current key. Verification accepts the current key and any previous
// one, for rotation.
//
// A Signer is immutable and safe for concurrent use.
type Signer struct {
	keys [][]byte // keys[0] signs; every key verifies
}

// NewSigner returns a Signer that signs with secret and verifies with secret
// and every previous secret. Each must be at least MinSecretBytes long. The
// secrets are copied; errors never show them.
func NewSigner(secret []byte, previous ...[]byte) (*Signer, error) {
	s := &Signer{}
	for i, k := range append([][]byte{secret}, previous...) {
		if len(k) < MinSecretBytes {
			return nil, fmt.Errorf("signer: secret %d is shorter than %d bytes", i, MinSecretBytes)
		}
		s.keys = append(s.keys, append([]byte(nil), k...))
	}
	return s, nil
}

// Sign returns a copy of m whose gk-sig header, the last header, is the
// signature of m under the current key; any gk-sig m had is removed. m
// itself is not modified.
func (s *Signer) Sign(m kafka.Message) kafka.Message {
	sum := sigMAC(s.keys[0], m)
	sig := make([]byte, base64.RawURLEncoding.EncodedLen(len(sum)))
	base64.RawURLEncoding.Encode(sig, sum)
	return withHeaders(m, isSig, kafka.Header{Key: HeaderSig, Value: sig})
}

// Verify returns nil if m's gk-sig is its signature under one of the keys,
// ErrSigMissing if m has no gk-sig, and ErrSigMismatch otherwise.
func (s *Signer) Verify(m kafka.Message) error {
	var sig []byte
	n := 0
	for _, h := range m.Headers {
		if h.Key == HeaderSig {
			sig, n = h.Value, n+1
		}
	}
	switch {
	case n == 0:
		return ErrSigMissing
	case n > 1 || base64.RawURLEncoding.DecodedLen(len(sig)) != sha256.Size:
		return ErrSigMismatch
	}
	var got [sha256.Size]byte
	if _, err := base64.RawURLEncoding.Decode(got[:], sig); err != nil {
		return ErrSigMismatch
	}
	for _, k := range s.keys {
		if hmac.Equal(sigMAC(k, m), got[:]) {
			return nil
		}
	}
	return ErrSigMismatch
}

// sigMAC returns the HMAC-SHA256 under key of m's key, headers other than
// gk-sig and value. Every part but the value, which comes last, is prefixed
// by its length, and the headers by their number, so that no two events
// give the same input.
func sigMAC(key []byte, m kafka.Message) []byte {
	n := 0
	size := len(sigDomain) + len(m.Key) + 2*binary.MaxVarintLen64
	for _, h := range m.Headers {
		if !isSig(h.Key) {
			n++
			size += len(h.Key) + len(h.Value) + 2*binary.MaxVarintLen64
		}
	}
	b := make([]byte, 0, size)
	b = append(b, sigDomain...)
	b = binary.AppendUvarint(b, uint64(len(m.Key)))
	b = append(b, m.Key...)
	b = binary.AppendUvarint(b, uint64(n))
	for _, h := range m.Headers {
		if isSig(h.Key) {
			continue
		}
		b = binary.AppendUvarint(b, uint64(len(h.Key)))
		b = append(b, h.Key...)
		b = binary.AppendUvarint(b, uint64(len(h.Value)))
		b = append(b, h.Value...)
	}
	mac := hmac.New(sha256.New, key)
	mac.Write(b)
	mac.Write(m.Value)
	return mac.Sum(nil)
}

func isSig(name string) bool { return name == HeaderSig }
