package worker

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"
	"gopkg.in/yaml.v3"

	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
)

// maxLimitsFile bounds the size of LIMITS_FILE.
const maxLimitsFile = 16 << 20

// limitsFile is the YAML form of LIMITS_FILE:
//
//	default: [100/1m]          # every tenant without rules of its own (optional)
//	tenants:
//	  acme: [1000/1m, 50000/1d]
//	  "weird tenant/with:chars": [10/1s]
//
// A rule list may also be written as one string, "1000/1m, 50000/1d".
// Unknown top-level keys are errors, so a typo does not silently drop rules.
type limitsFile struct {
	Default ruleList            `yaml:"default"`
	Tenants map[string]ruleList `yaml:"tenants"`
}

// ruleList is a YAML sequence of rules, or one comma-separated string.
type ruleList []string

// UnmarshalYAML accepts a sequence of rule strings or one string.
func (l *ruleList) UnmarshalYAML(n *yaml.Node) error {
	switch n.Kind {
	case yaml.ScalarNode:
		if n.Tag == "!!null" {
			return fmt.Errorf("line %d: empty rule list", n.Line)
		}
		for _, s := range strings.Split(n.Value, ",") {
			*l = append(*l, strings.TrimSpace(s))
		}
		return nil
	case yaml.SequenceNode:
		var s []string
		if err := n.Decode(&s); err != nil {
			return err
		}
		if len(s) == 0 {
			return fmt.Errorf("line %d: empty rule list", n.Line)
		}
		*l = s
		return nil
	}
	return fmt.Errorf("line %d: want a list of rules like [100/1m, 5000/1d]", n.Line)
}

// parseLimitsFile converts the YAML of LIMITS_FILE to rules. Tenant names may
// hold any characters; "*" is not a tenant (use default:).
func parseLimitsFile(data []byte) (*limit.Rules, error) {
	var f limitsFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("no rules (empty file)")
		}
		return nil, fmt.Errorf("bad YAML: %s", OneLine(strings.TrimPrefix(err.Error(), "yaml: ")))
	}
	if _, ok := f.Tenants["*"]; ok {
		return nil, errors.New(`tenant "*": write the rules for every other tenant under default:`)
	}
	byTenant := make(map[string][]string, len(f.Tenants))
	for t, rules := range f.Tenants {
		byTenant[t] = rules
	}
	var fallback []string
	if f.Default != nil {
		fallback = f.Default
	}
	rules, err := limit.NewRules(fallback, byTenant)
	if err != nil {
		return nil, err
	}
	return rules, nil
}

// readLimitsFile reads LIMITS_FILE, bounded in size.
func readLimitsFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxLimitsFile+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxLimitsFile {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, maxLimitsFile)
	}
	return data, nil
}

// loadedLimits are the rules of LIMITS or LIMITS_FILE, parsed; for
// LIMITS_FILE, with the digest of the content they were parsed from.
type loadedLimits struct {
	rules *limit.Rules
	sum   [sha256.Size]byte
}

// loadLimitsFile reads and parses LIMITS_FILE. Errors name the file.
func loadLimitsFile(path string) (loadedLimits, error) {
	data, err := readLimitsFile(path)
	if err != nil {
		return loadedLimits{}, err
	}
	rules, err := parseLimitsFile(data)
	if err != nil {
		return loadedLimits{}, fmt.Errorf("%s: %w", path, err)
	}
	return loadedLimits{rules: rules, sum: sha256.Sum256(data)}, nil
}

// Watcher reloads LIMITS_FILE when it changes and hands the new rules to
// apply. It watches the file's directory, not the file, because editors and
// Kubernetes ConfigMaps replace files (rename, symlink swap) rather than
// write them in place; any event in the directory leads, after a short
// debounce, to a reread, and rules are applied only when the content
// changed. A periodic reread covers file systems without notifications.
// An invalid file keeps the rules in force: the error is logged and counted.
//
// Load (or, in Serve, start from the content Config.Validate read), then
// Run once. A Watcher is not meant to be used from several goroutines
// except that apply is called from Run's goroutine only.
type Watcher struct {
	path     string
	apply    func(*limit.Rules) error
	log      *slog.Logger
	reloads  *prometheus.CounterVec
	debounce time.Duration
	poll     time.Duration

	mu   sync.Mutex
	last [sha256.Size]byte // content last seen (valid or not)
	seen bool
}

// NewWatcher returns a Watcher of path. Metrics go to reg (nil: not
// registered).
func NewWatcher(path string, apply func(*limit.Rules) error, log *slog.Logger, reg prometheus.Registerer) (*Watcher, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("limits file: %w", err)
	}
	w := &Watcher{
		path:     abs,
		apply:    apply,
		log:      log.With(slog.String("file", abs)),
		debounce: 200 * time.Millisecond,
		poll:     time.Minute,
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gatekeeper_config_reloads_total",
			Help: "Reloads of LIMITS_FILE after a change, by result (ok, error). An error keeps the rules in force.",
		}, []string{"result"}),
	}
	w.reloads.WithLabelValues("ok")
	w.reloads.WithLabelValues("error")
	if reg != nil {
		if err := reg.Register(w.reloads); err != nil {
			return nil, fmt.Errorf("register reload metrics: %w", err)
		}
	}
	return w, nil
}

// Load reads the rules now in the file, for start-up, and remembers its
// content so that Run reacts only to later changes.
func (w *Watcher) Load() (*limit.Rules, error) {
	l, err := loadLimitsFile(w.path)
	if err != nil {
		return nil, err
	}
	w.loaded(l)
	return l.rules, nil
}

// loaded remembers the content l was read from, the rules in force, in
// place of Load when the file has been read already.
func (w *Watcher) loaded(l loadedLimits) {
	w.mu.Lock()
	w.last, w.seen = l.sum, true
	w.mu.Unlock()
}

// Run watches until ctx is done, then returns nil. It returns an error only
// if the directory cannot be watched.
func (w *Watcher) Run(ctx context.Context) error {
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch limits file: %w", err)
	}
	defer fw.Close()
	if err := fw.Add(filepath.Dir(w.path)); err != nil {
		return fmt.Errorf("watch limits file: %w", err)
	}
	// A change between Load and Add has no event: look once now.
	w.reload()

	debounce := time.NewTimer(time.Hour)
	debounce.Stop()
	defer debounce.Stop()
	poll := time.NewTicker(w.poll)
	defer poll.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-fw.Events:
			if !ok {
				return errors.New("watch limits file: watcher closed")
			}
			w.log.Debug("limits file event", slog.String("event", ev.String()))
			debounce.Reset(w.debounce)
		case err, ok := <-fw.Errors:
			if !ok {
				return errors.New("watch limits file: watcher closed")
			}
			w.log.Warn("limits file watch error", slog.Any("error", err))
		case <-debounce.C:
			w.reload()
		case <-poll.C:
			w.reload()
		}
	}
}

// reload rereads the file and applies it if its content changed.
func (w *Watcher) reload() {
	data, err := readLimitsFile(w.path)
	var sum [sha256.Size]byte
	if err == nil {
		sum = sha256.Sum256(data)
	} else {
		// A missing or unreadable file counts as one distinct content.
		sum = sha256.Sum256([]byte("\x00error: " + err.Error()))
	}
	w.mu.Lock()
	unchanged := w.seen && sum == w.last
	w.last, w.seen = sum, true
	w.mu.Unlock()
	if unchanged {
		return
	}
	var rules *limit.Rules
	if err == nil {
		rules, err = parseLimitsFile(data)
	}
	if err == nil {
		err = w.apply(rules)
	}
	if err != nil {
		w.reloads.WithLabelValues("error").Inc()
		w.log.Error("limits file not applied, keeping the rules in force", slog.String("error", OneLine(err.Error())))
		return
	}
	w.reloads.WithLabelValues("ok").Inc()
	w.log.Info("limits file applied", slog.Int("tenants", len(rules.Tenants())))
}
