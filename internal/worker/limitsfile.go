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
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"
	"gopkg.in/yaml.v3"

	"github.com/gatekeeper-dev/gatekeeper/internal/limit"
)

// maxLimitsFile bounds the size of LIMITS_FILE: 1 MiB, some 40,000
// tenants with rules of their own.
const maxLimitsFile = 1 << 20

// LIMITS_FILE is one YAML document:
//
//	default: [100/1m]          # every tenant without rules of its own (optional)
//	tenants:
//	  acme: [1000/1m, 50000/1d]
//	  bulk: [1000/1m, 10MiB/1m, 2GiB/1d]   # events and bytes
//	  "weird tenant/with:chars": [10/1s]
//
// A rule list may also be written as one string, "1000/1m, 50000/1d".
// Rules are those of LIMITS (limit.ParseRules): events, bytes or units.
// Unknown top-level keys are errors, so a typo does not silently drop rules.
//
// The document is parsed into yaml.Nodes and walked here rather than
// decoded into Go values: yaml.v3 checks a mapping's keys for duplicates in
// quadratic time (20 s for 40,000 tenants), and its errors quote the
// content, which must not reach the logs (LIMITS_FILE pointed at a secret
// file would print it). Errors name a line and column and a generic reason,
// or a tenant and a rule, quoted.

// parseLimitsFile converts the YAML of LIMITS_FILE to rules.
func parseLimitsFile(data []byte) (*limit.Rules, error) {
	root, err := oneDocument(data)
	if err != nil {
		return nil, err
	}
	if root.Kind != yaml.MappingNode {
		return nil, nodeError(root, "want a mapping with default: and tenants:")
	}
	var fallback []string
	byTenant := map[string][]string{}
	var seen [2]bool
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		switch {
		case k.Kind == yaml.ScalarNode && k.Value == "default" && !seen[0]:
			seen[0] = true
			if fallback, err = ruleList(v); err != nil {
				return nil, fmt.Errorf("default: %w", err)
			}
		case k.Kind == yaml.ScalarNode && k.Value == "tenants" && !seen[1]:
			seen[1] = true
			if err := tenantRules(v, byTenant); err != nil {
				return nil, err
			}
		case k.Kind == yaml.ScalarNode && (k.Value == "default" || k.Value == "tenants"):
			return nil, nodeError(k, "key given twice")
		default:
			return nil, nodeError(k, "unknown key (want default: or tenants:)")
		}
	}
	return limit.NewRules(fallback, byTenant)
}

// oneDocument parses data as exactly one YAML document and returns its
// top node.
func oneDocument(data []byte) (*yaml.Node, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc, second yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("no rules (empty file)")
		}
		return nil, syntaxError(err)
	}
	switch err := dec.Decode(&second); {
	case err == nil:
		return nil, nodeError(&second, "a second YAML document (want one)")
	case !errors.Is(err, io.EOF):
		return nil, syntaxError(err)
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 {
		return nil, errors.New("no rules (empty file)")
	}
	return doc.Content[0], nil
}

// yamlLine finds the line of a yaml.v3 syntax error, and its reason when
// that is one of the parser's own words, which quote nothing of the file.
var yamlLine = regexp.MustCompile(`^yaml: line (\d+): ([a-zA-Z ]+)$`)

// anyLine finds a line number in any other yaml.v3 error.
var anyLine = regexp.MustCompile(`\bline (\d+)\b`)

// syntaxError reports a YAML syntax error by its line and reason, without
// quoting the file.
func syntaxError(err error) error {
	if m := yamlLine.FindStringSubmatch(err.Error()); m != nil {
		return fmt.Errorf("bad YAML: line %s: %s", m[1], m[2])
	}
	if m := anyLine.FindStringSubmatch(err.Error()); m != nil {
		return fmt.Errorf("bad YAML: line %s: not valid YAML", m[1])
	}
	return errors.New("bad YAML: not valid YAML")
}

// nodeError is a structural error at n: its line and column and a reason,
// no content.
func nodeError(n *yaml.Node, reason string) error {
	return fmt.Errorf("bad YAML: line %d, column %d: %s", n.Line, n.Column, reason)
}

// tenantRules adds the rules of the tenants: mapping n to byTenant. Tenant
// names are checked by limit.NewRules; "*" is not a tenant (use default:).
func tenantRules(n *yaml.Node, byTenant map[string][]string) error {
	n = resolve(n)
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		return nodeError(n, "tenants: want a mapping of tenant names to rule lists")
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode || k.Tag == "!!merge" || k.Tag == "!!null" {
			return nodeError(k, "want a tenant name")
		}
		t := k.Value
		if t == "*" {
			return errors.New(`tenant "*": write the rules for every other tenant under default:`)
		}
		if _, dup := byTenant[t]; dup {
			return fmt.Errorf("line %d: tenant %q given twice", k.Line, t)
		}
		rules, err := ruleList(v)
		if err != nil {
			return fmt.Errorf("tenant %q: %w", t, err)
		}
		byTenant[t] = rules
	}
	return nil
}

// ruleList reads a sequence of rule strings or one comma-separated string;
// null is no rules.
func ruleList(n *yaml.Node) ([]string, error) {
	n = resolve(n)
	switch n.Kind {
	case yaml.ScalarNode:
		if n.Tag == "!!null" {
			return nil, nil
		}
		var out []string
		for _, s := range strings.Split(n.Value, ",") {
			out = append(out, strings.TrimSpace(s))
		}
		return out, nil
	case yaml.SequenceNode:
		if len(n.Content) == 0 {
			return nil, nodeError(n, "empty rule list")
		}
		out := make([]string, 0, len(n.Content))
		for _, r := range n.Content {
			if r = resolve(r); r.Kind != yaml.ScalarNode {
				return nil, nodeError(r, "want a rule like 100/1m")
			}
			out = append(out, r.Value)
		}
		return out, nil
	}
	return nil, nodeError(n, "want a list of rules like [100/1m, 5000/1d]")
}

// resolve returns the node an alias (*name) stands for, or n.
func resolve(n *yaml.Node) *yaml.Node {
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		return n.Alias
	}
	return n
}

// readLimitsFile reads LIMITS_FILE: a regular file of at most
// maxLimitsFile bytes (readBoundedFile).
func readLimitsFile(path string) ([]byte, error) { return readBoundedFile(path, maxLimitsFile) }

// readBoundedFile reads a regular file (a FIFO or a device would block or
// never end) of at most max bytes: the one way the worker reads the files
// its settings name. It opens the file without blocking and checks what it
// opened, so a file swapped for a FIFO after the first check cannot block
// it either.
func readBoundedFile(path string, max int) ([]byte, error) {
	if st, err := os.Stat(path); err != nil {
		return nil, err
	} else if err := regularFile(path, st); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if err := regularFile(path, st); err != nil {
		return nil, err
	}
	data, err := io.ReadAll(io.LimitReader(f, int64(max)+1))
	if err != nil {
		return nil, err
	}
	if len(data) > max {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, max)
	}
	return data, nil
}

// regularFile reports an error unless st is a regular file's.
func regularFile(path string, st os.FileInfo) error {
	if st.Mode().IsRegular() {
		return nil
	}
	what := "not a regular file"
	switch {
	case st.IsDir():
		what = "a directory, not a regular file"
	case st.Mode()&os.ModeNamedPipe != 0:
		what = "a FIFO, not a regular file"
	case st.Mode()&os.ModeDevice != 0:
		what = "a device, not a regular file"
	}
	return fmt.Errorf("%s: %s", path, what)
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
			w.log.Warn("limits file watch error", slog.Any("err", err))
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
		w.log.Error("limits file not applied, keeping the rules in force", slog.String("err", OneLine(err.Error())))
		return
	}
	w.reloads.WithLabelValues("ok").Inc()
	w.log.Info("limits file applied", slog.Int("tenants", len(rules.Tenants())))
}
