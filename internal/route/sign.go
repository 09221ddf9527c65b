package route

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

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
// cannot be taken for any other use of the key. It changes with the format:
// v2 binds the signature to the retry tier topic the event is written to;
// v1 (no topic) is accepted only while unsigned events are (AcceptUnsignedUntil).
const (
	sigDomain   = "gatekeeper gk-sig v2\x00"
	sigDomainV1 = "gatekeeper gk-sig v1\x00"
)

// Signer signs the events Gatekeeper writes to the retry tiers and verifies
// the events it reads back, so that whoever can write a retry topic cannot
// forge gk- headers: a far gk-reserved (forwarded uncounted), another
// tenant's gk-tenant, or a signed header set moved onto another event.
//
// gk-sig is the unpadded base64url HMAC-SHA256 of the retry tier topic the
// event is written to, its key, its headers other than gk-sig (names and
// values, in order: the gk- deferral headers, which hold the reservation,
// and the producer's own) and its value, each length-prefixed, under the
// current key. A signed event is valid only in the tier it was written to:
// copied to another tier, or back from the downstream or dead-letter topic
// (where gk-sig is removed), it does not verify. Verification accepts the
// current key and any previous one, for rotation.
//
// A Signer is immutable and safe for concurrent use.
type Signer struct {
	keys [][]byte // keys[0] signs; every key verifies
	// Until unsignedUntil (by now), events without gk-sig, or signed in the
	// v1 format, are accepted: the transition while signing is turned on.
	unsignedUntil time.Time
	now           func() time.Time
}

// AcceptUnsignedUntil returns a copy of s that, until t by now (nil:
// time.Now), also accepts events without gk-sig and events signed in the
// format before the topic was bound: those written by replicas without the
// secret, or by an older release, while a rollout turns signing on.
func (s *Signer) AcceptUnsignedUntil(t time.Time, now func() time.Time) *Signer {
	c := *s
	c.unsignedUntil, c.now = t, now
	if c.now == nil {
		c.now = time.Now
	}
	return &c
}

// accepting reports whether unsigned events are still accepted.
func (s *Signer) accepting() bool {
	return !s.unsignedUntil.IsZero() && s.now().Before(s.unsignedUntil)
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
	sum := sigMAC(s.keys[0], sigDomain, m)
	sig := make([]byte, base64.RawURLEncoding.EncodedLen(len(sum)))
	base64.RawURLEncoding.Encode(sig, sum)
	return withHeaders(m, isSig, kafka.Header{Key: HeaderSig, Value: sig})
}

// Verify returns nil if m's gk-sig is its signature, for the topic m was
// read from, under one of the keys, ErrSigMissing if m has no gk-sig, and
// ErrSigMismatch otherwise. While unsigned events are accepted
// (AcceptUnsignedUntil), it also returns nil for an event without gk-sig or
// signed in the v1 format.
func (s *Signer) Verify(m kafka.Message) error {
	err := s.verify(m, sigDomain)
	if err == nil || !s.accepting() {
		return err
	}
	if errors.Is(err, ErrSigMissing) || s.verify(m, sigDomainV1) == nil {
		return nil
	}
	return err
}

func (s *Signer) verify(m kafka.Message, domain string) error {
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
		if hmac.Equal(sigMAC(k, domain, m), got[:]) {
			return nil
		}
	}
	return ErrSigMismatch
}

// sigMAC returns the HMAC-SHA256 under key of domain, m's topic (from v2),
// key, headers other than gk-sig and value. Every part but the value, which
// comes last, is prefixed by its length, and the headers by their number, so
// that no two events give the same input.
func sigMAC(key []byte, domain string, m kafka.Message) []byte {
	n := 0
	size := len(domain) + len(m.Topic) + len(m.Key) + 3*binary.MaxVarintLen64
	for _, h := range m.Headers {
		if !isSig(h.Key) {
			n++
			size += len(h.Key) + len(h.Value) + 2*binary.MaxVarintLen64
		}
	}
	b := make([]byte, 0, size)
	b = append(b, domain...)
	if domain != sigDomainV1 {
		b = binary.AppendUvarint(b, uint64(len(m.Topic)))
		b = append(b, m.Topic...)
	}
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

// withoutSig returns m without gk-sig, and m itself when it has none (the
// common case costs nothing): what leaves the retry path, downstream or to
// the dead-letter topic, carries no signature that could be replayed into a
// retry tier.
func withoutSig(m kafka.Message) kafka.Message {
	for _, h := range m.Headers {
		if isSig(h.Key) {
			return withHeaders(m, isSig)
		}
	}
	return m
}
