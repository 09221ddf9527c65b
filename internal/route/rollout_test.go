package route

import (
	"encoding/base64"
	"fmt"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
)

// pod is one replica's signing configuration during a rollout: nil signs
// nothing and checks nothing (RETRY_SECRET unset).
type pod struct {
	name   string
	signer *Signer
}

// writes returns what p writes to the retry tier topic for m.
func (p pod) writes(m kafka.Message, topic string) kafka.Message {
	m = WithDeferral(m, testDeferral())
	m.Topic = topic
	if p.signer != nil {
		m = p.signer.Sign(m)
	}
	return m
}

// accepts reports whether p's retry role takes m rather than dead-letter it.
func (p pod) accepts(m kafka.Message) error {
	if p.signer == nil {
		return nil
	}
	return p.signer.Verify(m)
}

// TestSignerRollout follows the README's procedures for turning signing on
// and for rotating RETRY_SECRET one replica at a time: at every step, the
// replicas of the old and the new configuration run side by side, and every
// event any of them defers is accepted by every one of them, so that nothing
// is dead-lettered. The one-step rotation, which the README warns against,
// is shown to dead-letter.
func TestSignerRollout(t *testing.T) {
	s1, s2 := testSecret, testOtherKeys
	now := t0
	clock := func() time.Time { return now }
	until := t0.Add(48 * time.Hour) // the rollout's end plus DEFER_HORIZON
	signer := func(secret []byte, previous ...[]byte) *Signer { return newTestSigner(t, secret, previous...) }

	steps := []struct {
		name     string
		old, new pod
		at       time.Time
		wantOK   bool
	}{
		{name: "turn on: RETRY_SECRET with RETRY_ACCEPT_UNSIGNED_UNTIL beside unsigned replicas",
			old: pod{"unsigned", nil}, new: pod{"secret, accept unsigned", signer(s1).AcceptUnsignedUntil(until, clock)}, at: t0, wantOK: true},
		{name: "turn on, after the transition: every replica signs",
			old: pod{"secret, accept unsigned", signer(s1).AcceptUnsignedUntil(until, clock)}, new: pod{"secret", signer(s1)}, at: until.Add(time.Second), wantOK: true},
		{name: "rotate 1: the new secret as RETRY_SECRET_PREVIOUS (learned, not used)",
			old: pod{"s1", signer(s1)}, new: pod{"s1, accepts s2", signer(s1, s2)}, at: t0, wantOK: true},
		{name: "rotate 2: swap, the old secret as RETRY_SECRET_PREVIOUS",
			old: pod{"s1, accepts s2", signer(s1, s2)}, new: pod{"s2, accepts s1", signer(s2, s1)}, at: t0, wantOK: true},
		{name: "rotate 3, after DEFER_HORIZON: the new secret alone",
			old: pod{"s2, accepts s1", signer(s2, s1)}, new: pod{"s2", signer(s2)}, at: t0, wantOK: true},
		{name: "one-step rotation (not the procedure)",
			old: pod{"s1", signer(s1)}, new: pod{"s2, accepts s1", signer(s2, s1)}, at: t0, wantOK: false},
		{name: "turning on without the transition (not the procedure)",
			old: pod{"unsigned", nil}, new: pod{"secret", signer(s1)}, at: t0, wantOK: false},
	}
	src := kafka.Message{Key: []byte("k"), Value: []byte("v")}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			now = st.at
			var failures []string
			for _, writer := range []pod{st.old, st.new} {
				for _, tier := range testTopics.Tiers() {
					m := writer.writes(src, tier.Topic)
					for _, reader := range []pod{st.old, st.new} {
						if err := reader.accepts(m); err != nil {
							failures = append(failures, fmt.Sprintf("%s wrote to %s, %s dead-letters it: %v", writer.name, tier.Topic, reader.name, err))
						}
					}
				}
			}
			if st.wantOK && len(failures) > 0 {
				t.Errorf("dead letters during the step: %v", failures)
			}
			if !st.wantOK && len(failures) == 0 {
				t.Error("no dead letter, want some: the step is unsafe")
			}
		})
	}
}

// TestSignerAcceptUnsignedUntil: during the transition an event without
// gk-sig, or signed before gk-sig was bound to its tier (v1), is accepted;
// a wrong signature never is; after it, only the current format.
func TestSignerAcceptUnsignedUntil(t *testing.T) {
	now := t0
	s := newTestSigner(t, testSecret).AcceptUnsignedUntil(t0.Add(time.Hour), func() time.Time { return now })
	base := WithDeferral(kafka.Message{Topic: "down.retry", Key: []byte("k"), Value: []byte("v")}, testDeferral())
	v1 := withHeaders(base, isSig, kafka.Header{Key: HeaderSig, Value: sigV1(testSecret, base)})
	wrong := newTestSigner(t, testOtherKeys).Sign(base)
	for _, tt := range []struct {
		name          string
		msg           kafka.Message
		during, after error
	}{
		{"signed", s.Sign(base), nil, nil},
		{"unsigned", base, nil, ErrSigMissing},
		{"signed in v1", v1, nil, ErrSigMismatch},
		{"another key", wrong, ErrSigMismatch, ErrSigMismatch},
	} {
		t.Run(tt.name, func(t *testing.T) {
			now = t0
			if err := s.Verify(tt.msg); err != tt.during {
				t.Errorf("during the transition: got %v, want %v", err, tt.during)
			}
			now = t0.Add(time.Hour)
			if err := s.Verify(tt.msg); err != tt.after {
				t.Errorf("after it: got %v, want %v", err, tt.after)
			}
		})
	}
}

// sigV1 is a gk-sig in the format before the topic was bound.
func sigV1(key []byte, m kafka.Message) []byte {
	sum := sigMAC(key, sigDomainV1, m)
	return []byte(base64.RawURLEncoding.EncodeToString(sum))
}
