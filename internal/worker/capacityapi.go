package worker

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
	"github.com/gatekeeper-dev/gatekeeper/internal/pace"
)

// Paths of the capacity API: the pacing's state, and an operator's cap.
const (
	capacityPath    = "/v1/capacity"
	capacityCapPath = "/v1/capacity/cap"
)

// maxCapacityCap bounds how long an operator's cap may last.
const maxCapacityCap = 7 * 24 * time.Hour

// capacityAPI serves GET /v1/capacity, PUT and DELETE /v1/capacity/cap.
// Safe for concurrent use.
type capacityAPI struct {
	pace  func() *pace.Runner // nil: no capacity, or not started
	clock func() time.Time
	log   *slog.Logger
	// measure is what CAPACITY counts: a cap's rate is of it a second.
	measure limit.Measure
}

// CapacityView is the body of GET /v1/capacity: this replica's view of the
// pacing and the newest audit entries of the caps.
type CapacityView struct {
	pace.Status
	Audit []pace.CapEntry `json:"audit"`
}

// CapacityCap is the body of PUT /v1/capacity/cap: a cap of Rate events a
// second, or bytes or units for a capacity of them (or Capacity, e.g.
// "500/1s", "1MiB/1s", of CAPACITY's measure) until Until, or for For (a Go
// duration), with a reason. DELETE takes the reason alone.
type CapacityCap struct {
	Rate     float64    `json:"rate,omitempty"`
	Capacity string     `json:"capacity,omitempty"`
	Until    *time.Time `json:"until,omitempty"`
	For      string     `json:"for,omitempty"`
	Reason   string     `json:"reason"`
}

func (a *capacityAPI) routes(mux *http.ServeMux, auth func(string, http.Handler) http.Handler) {
	h := func(scope string, f func(http.ResponseWriter, *http.Request, *pace.Runner)) http.Handler {
		return auth(scope, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			p := a.pace()
			if p == nil {
				writeJSON(w, http.StatusServiceUnavailable, errorResponse{Error: "no capacity (CAPACITY unset), or not started yet"})
				return
			}
			f(w, r, p)
		}))
	}
	mux.Handle("GET "+capacityPath, h(ScopeRead, a.get))
	mux.Handle("PUT "+capacityCapPath, h(ScopeWrite, a.put))
	mux.Handle("DELETE "+capacityCapPath, h(ScopeWrite, a.delete))
}

// note is the line of /readyz.
func (a *capacityAPI) note() string {
	if p := a.pace(); p != nil {
		return p.Note()
	}
	return ""
}

func (a *capacityAPI) get(w http.ResponseWriter, r *http.Request, p *pace.Runner) {
	log, err := p.Fleet.Audit(r.Context(), 20)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, CapacityView{Status: p.Status(), Audit: log})
}

// readCap decodes a body of at most 64 KiB into v.
func readCap(r *http.Request, v *CapacityCap) error {
	if r.Body == nil {
		return errors.New("a JSON body is required")
	}
	data, err := io.ReadAll(io.LimitReader(r.Body, maxOverrideBody+1))
	if err != nil {
		return err
	}
	if len(data) > maxOverrideBody {
		return fmt.Errorf("body over %d bytes", maxOverrideBody)
	}
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("bad JSON: %w", err)
	}
	if strings.TrimSpace(v.Reason) == "" {
		return errors.New("reason is required (why the capacity is capped or freed)")
	}
	return nil
}

// capOf returns the cap of a PUT body at time now, for a capacity of
// measure m. Errors name the field.
func capOf(b CapacityCap, now time.Time, m limit.Measure) (pace.Cap, error) {
	c := pace.Cap{Rate: b.Rate, Why: b.Reason, At: now}
	switch {
	case b.Capacity != "" && b.Rate != 0:
		return c, errors.New("rate or capacity, not both")
	case b.Capacity != "":
		r, err := limit.ParseCapacity(b.Capacity)
		if err != nil || len(r) != 1 {
			return c, fmt.Errorf("capacity %q: want one rule, e.g. 500/1s", b.Capacity)
		}
		if r.Measure() != m {
			return c, fmt.Errorf("capacity %q counts %s, CAPACITY counts %s", b.Capacity, r.Measure(), m)
		}
		c.Rate = r.Rate()
	}
	if !(c.Rate > 0) {
		return c, fmt.Errorf("rate: want %s a second above 0 (or capacity, e.g. 500/1s)", m)
	}
	switch {
	case b.Until != nil && b.For != "":
		return c, errors.New("until or for, not both")
	case b.Until != nil:
		c.Until = *b.Until
	case b.For != "":
		d, err := time.ParseDuration(b.For)
		if err != nil {
			return c, fmt.Errorf("for %q: want a Go duration, e.g. 15m", b.For)
		}
		c.Until = now.Add(d)
	default:
		return c, errors.New("until (RFC 3339) or for (e.g. 15m) is required: a cap ends")
	}
	if !c.Until.After(now) || c.Until.Sub(now) > maxCapacityCap {
		return c, fmt.Errorf("the cap must end after now and within %v", maxCapacityCap)
	}
	return c, nil
}

func (a *capacityAPI) put(w http.ResponseWriter, r *http.Request, p *pace.Runner) {
	var body CapacityCap
	if err := readCap(r, &body); err != nil {
		writeJSON(w, http.StatusBadRequest, errorResponse{Error: err.Error()})
		return
	}
	c, err := capOf(body, a.clock().UTC().Truncate(time.Millisecond), a.measure)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, errorResponse{Error: err.Error()})
		return
	}
	c.By = TokenName(r.Context())
	if err := p.Fleet.SetCap(r.Context(), c); err != nil {
		a.fail(w, r, err)
		return
	}
	a.log.Info("capacity capped", slog.Float64("rate", c.Rate), slog.Time("until", c.Until), slog.String("by", c.By), slog.String("reason", c.Why))
	writeJSON(w, http.StatusOK, c)
}

func (a *capacityAPI) delete(w http.ResponseWriter, r *http.Request, p *pace.Runner) {
	var body CapacityCap
	if err := readCap(r, &body); err != nil {
		writeJSON(w, http.StatusBadRequest, errorResponse{Error: err.Error()})
		return
	}
	by := TokenName(r.Context())
	if err := p.Fleet.LiftCap(r.Context(), by, body.Reason, a.clock().UTC()); err != nil {
		a.fail(w, r, err)
		return
	}
	a.log.Info("capacity cap lifted", slog.String("by", by), slog.String("reason", body.Reason))
	writeJSON(w, http.StatusOK, map[string]string{"lifted_by": by})
}

func (a *capacityAPI) fail(w http.ResponseWriter, r *http.Request, err error) {
	a.log.LogAttrs(r.Context(), slog.LevelWarn, "capacity API failed", slog.String("path", r.URL.Path), slog.String("err", err.Error()))
	writeJSON(w, http.StatusServiceUnavailable, errorResponse{Error: "capacity state unavailable: " + OneLine(err.Error())})
}
