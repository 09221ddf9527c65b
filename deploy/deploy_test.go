package deploy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	keda "github.com/kedacore/keda/v2/apis/keda/v1alpha1"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/types"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// The tests read the files next to this one: go test runs in deploy/.
const (
	k8sDir      = "k8s"
	composeFile = "compose/compose.yaml"
	dockerfile  = "docker/Dockerfile"
)

var binary struct {
	once sync.Once
	dir  string
	path string
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binary.dir != "" {
		os.RemoveAll(binary.dir)
	}
	os.Exit(code)
}

// gatekeeperBinary builds cmd/gatekeeper once; the tests run its
// config-table and check-config subcommands.
func gatekeeperBinary(t *testing.T) string {
	t.Helper()
	binary.once.Do(func() {
		binary.dir, binary.err = os.MkdirTemp("", "gatekeeper-deploy-test-")
		if binary.err != nil {
			return
		}
		binary.path = filepath.Join(binary.dir, "gatekeeper")
		cmd := exec.Command("go", "build", "-o", binary.path, "./cmd/gatekeeper")
		cmd.Dir = ".."
		if out, err := cmd.CombinedOutput(); err != nil {
			binary.err = fmt.Errorf("go build ./cmd/gatekeeper: %v\n%s", err, out)
		}
	})
	if binary.err != nil {
		t.Fatal(binary.err)
	}
	return binary.path
}

var configKeyRE = regexp.MustCompile("(?m)^\\| `(GATEKEEPER_[A-Z0-9_]+)` \\|")

// configVars returns the names of every GATEKEEPER_ variable, as the binary
// lists them (gatekeeper config-table).
func configVars(t *testing.T) map[string]bool {
	t.Helper()
	out, err := exec.Command(gatekeeperBinary(t), "config-table").Output()
	if err != nil {
		t.Fatalf("gatekeeper config-table: %v", err)
	}
	vars := map[string]bool{}
	for _, m := range configKeyRE.FindAllStringSubmatch(string(out), -1) {
		vars[m[1]] = true
	}
	if len(vars) < 20 {
		t.Fatalf("gatekeeper config-table: got %d variables, want the full list:\n%s", len(vars), out)
	}
	return vars
}

// checkConfig runs `gatekeeper check-config` with exactly env and returns
// the printed configuration (KEY -> value, secrets shown as ****).
func checkConfig(t *testing.T, env map[string]string) map[string]string {
	t.Helper()
	cmd := exec.Command(gatekeeperBinary(t), "check-config")
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("gatekeeper check-config: %v: %s", err, strings.TrimSpace(stderr.String()))
	}
	if s := strings.TrimSpace(stderr.String()); s != "" {
		t.Errorf("gatekeeper check-config stderr: got %q, want nothing", s)
	}
	printed := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
		k, v, _ := strings.Cut(l, "=")
		printed[k] = v
	}
	return printed
}

// checkConfigFails runs `gatekeeper check-config` with exactly env and
// returns its exit status and stderr, for a configuration it must refuse.
func checkConfigFails(t *testing.T, env map[string]string) (int, string) {
	t.Helper()
	cmd := exec.Command(gatekeeperBinary(t), "check-config")
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		t.Fatalf("gatekeeper check-config: got %v, want a failed exit", err)
	}
	return exit.ExitCode(), stderr.String()
}

// ---- Kubernetes ----

// manifests are the decoded objects of deploy/k8s.
type manifests struct {
	files         []string // file names, kustomization.yaml excluded
	deployments   []*appsv1.Deployment
	configMaps    map[string]*corev1.ConfigMap
	secrets       map[string]*corev1.Secret
	services      []*corev1.Service
	pdbs          []*policyv1.PodDisruptionBudget
	scaledObjects []*scaledObject
	triggerAuths  map[string]*triggerAuthentication
	rules         []*prometheusRule
	kustomization *kustomization
}

// splitDocs splits a YAML stream at its "---" lines and drops empty documents.
func splitDocs(data []byte) [][]byte {
	var docs [][]byte
	for _, d := range regexp.MustCompile(`(?m)^---[ \t]*$`).Split(string(data), -1) {
		if len(yamlContent(d)) > 0 {
			docs = append(docs, []byte(d))
		}
	}
	return docs
}

// yamlContent is doc without comment and blank lines.
func yamlContent(doc string) string {
	var b strings.Builder
	for _, l := range strings.Split(doc, "\n") {
		if s := strings.TrimSpace(l); s != "" && !strings.HasPrefix(s, "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// decodeObject decodes one Kubernetes document strictly into the type of its
// apiVersion and kind: an unknown or duplicate field is an error.
func decodeObject(doc []byte) (any, error) {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return nil, err
	}
	var obj any
	switch tm.APIVersion + " " + tm.Kind {
	case "apps/v1 Deployment":
		obj = &appsv1.Deployment{}
	case "v1 ConfigMap":
		obj = &corev1.ConfigMap{}
	case "v1 Secret":
		obj = &corev1.Secret{}
	case "v1 Service":
		obj = &corev1.Service{}
	case "policy/v1 PodDisruptionBudget":
		obj = &policyv1.PodDisruptionBudget{}
	case "keda.sh/v1alpha1 ScaledObject":
		obj = &scaledObject{}
	case "keda.sh/v1alpha1 TriggerAuthentication":
		obj = &triggerAuthentication{}
	case "kustomize.config.k8s.io/v1beta1 Kustomization":
		obj = &kustomization{}
	case "monitoring.coreos.com/v1 PrometheusRule":
		obj = &prometheusRule{}
	default:
		return nil, fmt.Errorf("apiVersion %q kind %q: not a kind this test knows (add its type)", tm.APIVersion, tm.Kind)
	}
	if err := decodeStrict(doc, obj); err != nil {
		return nil, fmt.Errorf("%s: %w", tm.Kind, err)
	}
	return obj, nil
}

// decodeStrict decodes a YAML document into obj as kubectl and the API
// server do: YAML to JSON (duplicate keys are an error), then case-sensitive
// JSON decoding where an unknown field is an error. sigs.k8s.io/yaml's own
// UnmarshalStrict matches field names case-insensitively, so it would let
// "stringdata" or "readonlyRootFilesystem" through.
func decodeStrict(doc []byte, obj any) error {
	j, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return err
	}
	strict, err := kjson.UnmarshalStrict(j, obj)
	if err != nil {
		return err
	}
	return errors.Join(strict...)
}

func loadManifests(t *testing.T) *manifests {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(k8sDir, "*.yaml"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no manifests in %s: %v", k8sDir, err)
	}
	m := &manifests{
		configMaps:   map[string]*corev1.ConfigMap{},
		secrets:      map[string]*corev1.Secret{},
		triggerAuths: map[string]*triggerAuthentication{},
	}
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if filepath.Base(p) != "kustomization.yaml" {
			m.files = append(m.files, filepath.Base(p))
		}
		docs := splitDocs(data)
		if len(docs) == 0 {
			t.Errorf("%s: no object", p)
		}
		for i, doc := range docs {
			obj, err := decodeObject(doc)
			if err != nil {
				t.Errorf("%s, document %d: %v", p, i+1, err)
				continue
			}
			switch o := obj.(type) {
			case *appsv1.Deployment:
				m.deployments = append(m.deployments, o)
			case *corev1.ConfigMap:
				m.configMaps[o.Name] = o
			case *corev1.Secret:
				m.secrets[o.Name] = o
			case *corev1.Service:
				m.services = append(m.services, o)
			case *policyv1.PodDisruptionBudget:
				m.pdbs = append(m.pdbs, o)
			case *scaledObject:
				m.scaledObjects = append(m.scaledObjects, o)
			case *triggerAuthentication:
				m.triggerAuths[o.Name] = o
			case *kustomization:
				m.kustomization = o
			case *prometheusRule:
				m.rules = append(m.rules, o)
			}
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	for what, n := range map[string]int{
		"Deployment": len(m.deployments), "Service": len(m.services), "PodDisruptionBudget": len(m.pdbs),
		"ScaledObject": len(m.scaledObjects), "Secret": len(m.secrets), "TriggerAuthentication": len(m.triggerAuths),
		"PrometheusRule": len(m.rules),
	} {
		if n != 1 {
			t.Errorf("%s objects in %s: got %d, want 1", what, k8sDir, n)
		}
	}
	if len(m.configMaps) != 2 {
		t.Errorf("ConfigMaps in %s: got %d, want 2 (environment and limits file)", k8sDir, len(m.configMaps))
	}
	if m.kustomization == nil {
		t.Errorf("%s/kustomization.yaml: missing", k8sDir)
	}
	if t.Failed() {
		t.FailNow()
	}
	return m
}

// wiring is what the manifests say about the one gatekeeper container.
type wiring struct {
	m         *manifests
	dep       *appsv1.Deployment
	container *corev1.Container
	config    *corev1.ConfigMap // envFrom
	secret    *corev1.Secret    // envFrom
	limits    *corev1.ConfigMap // volume holding LIMITS_FILE
	env       map[string]string // ConfigMap and Secret, as the container sees them
	httpPort  int32
}

func loadWiring(t *testing.T) *wiring {
	t.Helper()
	m := loadManifests(t)
	w := &wiring{m: m, dep: m.deployments[0], env: map[string]string{}}
	spec := &w.dep.Spec.Template.Spec
	if len(spec.Containers) != 1 {
		t.Fatalf("Deployment %s containers: got %d, want 1", w.dep.Name, len(spec.Containers))
	}
	w.container = &spec.Containers[0]
	for _, ef := range w.container.EnvFrom {
		switch {
		case ef.ConfigMapRef != nil:
			w.config = m.configMaps[ef.ConfigMapRef.Name]
			if w.config == nil {
				t.Fatalf("envFrom configMapRef %q: no such ConfigMap", ef.ConfigMapRef.Name)
			}
		case ef.SecretRef != nil:
			w.secret = m.secrets[ef.SecretRef.Name]
			if w.secret == nil {
				t.Fatalf("envFrom secretRef %q: no such Secret", ef.SecretRef.Name)
			}
		}
		if ef.Prefix != "" {
			t.Errorf("envFrom prefix: got %q, want none (the keys are the variable names)", ef.Prefix)
		}
	}
	if w.config == nil || w.secret == nil {
		t.Fatalf("container %s envFrom: want a configMapRef and a secretRef", w.container.Name)
	}
	for k, v := range w.config.Data {
		w.env[k] = v
	}
	for k, v := range w.secret.Data {
		w.env[k] = string(v)
	}
	for k, v := range w.secret.StringData {
		w.env[k] = v
	}
	for _, v := range spec.Volumes {
		if v.ConfigMap != nil && v.ConfigMap.Name != w.config.Name {
			w.limits = m.configMaps[v.ConfigMap.Name]
		}
	}
	_, port, err := net.SplitHostPort(w.env["GATEKEEPER_HTTP_ADDR"])
	if err != nil {
		t.Fatalf("GATEKEEPER_HTTP_ADDR %q: %v", w.env["GATEKEEPER_HTTP_ADDR"], err)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	w.httpPort = int32(p)
	return w
}

// duration returns a duration variable of the environment, or def.
func (w *wiring) duration(t *testing.T, name string, def time.Duration) time.Duration {
	t.Helper()
	s, ok := w.env[name]
	if !ok {
		return def
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatalf("%s %q: %v", name, s, err)
	}
	return d
}

// list returns a comma-separated variable, trimmed.
func list(s string) []string {
	var out []string
	for _, x := range strings.Split(s, ",") {
		if x = strings.TrimSpace(x); x != "" {
			out = append(out, x)
		}
	}
	return out
}

// TestK8sManifestsDecodeStrictly decodes every manifest into its real type
// (unknown fields fail) and checks that kustomization.yaml lists them all.
func TestK8sManifestsDecodeStrictly(t *testing.T) {
	m := loadManifests(t)
	got := slices.Clone(m.kustomization.Resources)
	slices.Sort(got)
	want := slices.Clone(m.files)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("kustomization.yaml resources: got %v, want every manifest %v", got, want)
	}
	image := m.deployments[0].Spec.Template.Spec.Containers[0].Image
	repo, _, _ := strings.Cut(image, ":")
	for _, img := range m.kustomization.Images {
		if img.Name != repo {
			t.Errorf("kustomization.yaml images name: got %q, want the Deployment's image %q", img.Name, repo)
		}
	}
}

// TestStrictDecodingRejectsMistakes proves that the decoding above is
// strict: each manifest with one misspelt field must fail.
func TestStrictDecodingRejectsMistakes(t *testing.T) {
	tests := []struct{ file, from, to string }{
		{"deployment.yaml", "terminationGracePeriodSeconds:", "terminationGracePeriod:"},
		{"deployment.yaml", "readOnlyRootFilesystem:", "readonlyRootFilesystem:"},
		{"configmap.yaml", "data:", "datas:"},
		{"secret.yaml", "stringData:", "stringdata:"},
		{"service.yaml", "publishNotReadyAddresses:", "publishNotReady:"},
		{"pdb.yaml", "maxUnavailable:", "maxUnavailble:"},
		{"keda-scaledobject.yaml", "minReplicaCount:", "minReplicas:"},
		{"keda-scaledobject.yaml", "stabilizationWindowSeconds:", "stabilizationWindow:"},
		{"keda-triggerauthentication.yaml", "secretTargetRef:", "secretTargetRefs:"},
		{"kustomization.yaml", "resources:", "resource:"},
		{"prometheusrule.yaml", "alert:", "alrt:"},
		{"prometheusrule.yaml", "annotations:", "anotations:"},
	}
	for _, tt := range tests {
		t.Run(tt.file+"/"+strings.TrimSuffix(tt.to, ":"), func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join(k8sDir, tt.file))
			if err != nil {
				t.Fatal(err)
			}
			broken, ok := replaceField(data, tt.from, tt.to)
			if !ok {
				t.Fatalf("%s has no field %q to break", tt.file, tt.from)
			}
			var errs []error
			for _, doc := range splitDocs(broken) {
				if _, err := decodeObject(doc); err != nil {
					errs = append(errs, err)
				}
			}
			if len(errs) == 0 {
				t.Errorf("%s with %q as %q: got no error, want an unknown-field error", tt.file, tt.from, tt.to)
			}
		})
	}
	t.Run("compose/enviroment", func(t *testing.T) {
		data, err := os.ReadFile(composeFile)
		if err != nil {
			t.Fatal(err)
		}
		broken := strings.Replace(string(data), "    environment:\n      GATEKEEPER_", "    enviroment:\n      GATEKEEPER_", 1)
		if broken == string(data) {
			t.Fatal("compose.yaml: gatekeeper's environment: not found")
		}
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "compose.yaml"), []byte(broken), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := loadComposeFile(t, filepath.Join(dir, "compose.yaml")); err == nil {
			t.Error("compose.yaml with enviroment: got no error, want a schema error")
		}
	})
}

// replaceField replaces the first from that is not in a comment line.
func replaceField(data []byte, from, to string) ([]byte, bool) {
	lines := strings.SplitAfter(string(data), "\n")
	for i, l := range lines {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") && strings.Contains(l, from) {
			lines[i] = strings.Replace(l, from, to, 1)
			return []byte(strings.Join(lines, "")), true
		}
	}
	return nil, false
}

// TestK8sConfigIsValid checks the environment the container gets: only real
// GATEKEEPER_ variables, secrets only in the Secret, and a configuration
// (limits file included) that the binary's own check accepts.
func TestK8sConfigIsValid(t *testing.T) {
	w := loadWiring(t)
	vars := configVars(t)
	for _, obj := range []struct {
		what string
		keys []string
	}{
		{"ConfigMap " + w.config.Name, mapKeys(w.config.Data)},
		{"Secret " + w.secret.Name, append(mapKeys(w.secret.StringData), mapKeys(w.secret.Data)...)},
	} {
		for _, k := range obj.keys {
			if !vars[k] {
				t.Errorf("%s: %s is not a Gatekeeper variable (gatekeeper config-table lists them)", obj.what, k)
			}
		}
	}
	for k := range w.config.Data {
		_, inString := w.secret.StringData[k]
		_, inData := w.secret.Data[k]
		if inString || inData {
			t.Errorf("%s is in both ConfigMap %s and Secret %s", k, w.config.Name, w.secret.Name)
		}
	}

	// LIMITS_FILE is a key of the limits ConfigMap, mounted as a directory.
	limitsFile := w.env["GATEKEEPER_LIMITS_FILE"]
	if limitsFile == "" || w.limits == nil {
		t.Fatalf("want GATEKEEPER_LIMITS_FILE (got %q) in a ConfigMap volume (got %v)", limitsFile, w.limits)
	}
	rules, ok := w.limits.Data[filepath.Base(limitsFile)]
	if !ok {
		t.Fatalf("ConfigMap %s has no key %q (the base of GATEKEEPER_LIMITS_FILE %s)", w.limits.Name, filepath.Base(limitsFile), limitsFile)
	}
	local := filepath.Join(t.TempDir(), filepath.Base(limitsFile))
	if err := os.WriteFile(local, []byte(rules), 0o644); err != nil {
		t.Fatal(err)
	}
	env := maps(w.env)
	env["GATEKEEPER_LIMITS_FILE"] = local
	// Signing is on in the shipped manifests.
	if w.env["GATEKEEPER_RETRY_SECRET"] == "" {
		t.Errorf("Secret %s sets no GATEKEEPER_RETRY_SECRET: deferred events would not be signed", w.secret.Name)
	}
	// The Secret's placeholders stop the binary until they are replaced.
	if code, stderr := checkConfigFails(t, env); code != 1 || !strings.HasPrefix(stderr, "GATEKEEPER_ADMIN_TOKEN: ") {
		t.Errorf("check-config with the placeholders of Secret %s: got status %d, stderr %q; want 1 and a line naming GATEKEEPER_ADMIN_TOKEN", w.secret.Name, code, stderr)
	}
	for k, v := range env {
		if strings.HasPrefix(v, "REPLACE-ME") {
			env[k] = "replaced-" + strings.ToLower(k) + "-0123456789"
		}
	}
	printed := checkConfig(t, env)

	// Every secret the binary masks comes from the Secret, none from the ConfigMap.
	masked := 0
	for k, v := range printed {
		if v != "****" {
			continue
		}
		masked++
		if _, ok := w.config.Data[k]; ok {
			t.Errorf("%s is a secret (check-config masks it) but is in ConfigMap %s", k, w.config.Name)
		}
	}
	if masked < 3 {
		t.Errorf("masked secrets in check-config: got %d, want the admin token, Redis and SASL passwords set from the Secret", masked)
	}
	for _, k := range []string{"GATEKEEPER_ADMIN_TOKEN", "GATEKEEPER_REDIS_PASSWORD", "GATEKEEPER_KAFKA_SASL_PASSWORD"} {
		if printed[k] != "****" {
			t.Errorf("check-config %s: got %q, want **** (set from Secret %s)", k, printed[k], w.secret.Name)
		}
	}
}

func mapKeys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func maps(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// portMatches reports whether a probe or service port names or numbers the
// container port that serves GATEKEEPER_HTTP_ADDR.
func (w *wiring) portMatches(p intstr.IntOrString) bool {
	if p.Type == intstr.Int {
		return p.IntVal == w.httpPort
	}
	for _, cp := range w.container.Ports {
		if cp.Name == p.StrVal {
			return cp.ContainerPort == w.httpPort
		}
	}
	return false
}

// TestK8sDeployment checks the Deployment against the environment it gets:
// probes, port, limits volume, shutdown grace, security and resources, and
// that the Service and PodDisruptionBudget select its pods.
func TestK8sDeployment(t *testing.T) {
	w := loadWiring(t)
	c := w.container
	spec := w.dep.Spec.Template.Spec

	if !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.ContainerPort == w.httpPort }) {
		t.Errorf("container ports %v: want %d (GATEKEEPER_HTTP_ADDR %s)", c.Ports, w.httpPort, w.env["GATEKEEPER_HTTP_ADDR"])
	}
	for _, probe := range []struct {
		what  string
		p     *corev1.Probe
		path  string
		after time.Duration // the probe's timeout must exceed this
	}{
		{"livenessProbe", c.LivenessProbe, "/healthz", 0},
		{"readinessProbe", c.ReadinessProbe, "/readyz",
			min(w.duration(t, "GATEKEEPER_REDIS_TIMEOUT", 2*time.Second), w.duration(t, "GATEKEEPER_KAFKA_TIMEOUT", 10*time.Second))},
	} {
		if probe.p == nil || probe.p.HTTPGet == nil {
			t.Errorf("%s: want an httpGet probe of %s", probe.what, probe.path)
			continue
		}
		if got := probe.p.HTTPGet.Path; got != probe.path {
			t.Errorf("%s path: got %q, want %q", probe.what, got, probe.path)
		}
		if !w.portMatches(probe.p.HTTPGet.Port) {
			t.Errorf("%s port: got %v, want the container port %d", probe.what, probe.p.HTTPGet.Port.String(), w.httpPort)
		}
		if timeout := time.Duration(probe.p.TimeoutSeconds) * time.Second; timeout <= probe.after {
			t.Errorf("%s timeoutSeconds: got %v, want more than %v (the readiness checks' own timeout)", probe.what, timeout, probe.after)
		}
	}

	// The limits ConfigMap is a read-only directory mount (never subPath,
	// which would hide updates) at the directory of LIMITS_FILE.
	limitsDir := filepath.Dir(w.env["GATEKEEPER_LIMITS_FILE"])
	var volName string
	for _, v := range spec.Volumes {
		if v.ConfigMap != nil && w.limits != nil && v.ConfigMap.Name == w.limits.Name {
			volName = v.Name
			if len(v.ConfigMap.Items) > 0 {
				t.Errorf("volume %s items: got %v, want none (all keys, names unchanged)", v.Name, v.ConfigMap.Items)
			}
		}
	}
	mounted := false
	for _, vm := range c.VolumeMounts {
		if vm.Name != volName {
			continue
		}
		mounted = true
		if vm.MountPath != limitsDir || vm.SubPath != "" || !vm.ReadOnly {
			t.Errorf("mount of %s: got path %q subPath %q readOnly %v, want path %q, no subPath, read-only",
				vm.Name, vm.MountPath, vm.SubPath, vm.ReadOnly, limitsDir)
		}
	}
	if !mounted {
		t.Errorf("the limits ConfigMap is not mounted at %s", limitsDir)
	}

	grace := w.duration(t, "GATEKEEPER_SHUTDOWN_GRACE", 25*time.Second)
	if spec.TerminationGracePeriodSeconds == nil || time.Duration(*spec.TerminationGracePeriodSeconds)*time.Second < grace+5*time.Second {
		t.Errorf("terminationGracePeriodSeconds: got %v, want at least GATEKEEPER_SHUTDOWN_GRACE %v + 5s", ptrString(spec.TerminationGracePeriodSeconds), grace)
	}

	psc, sc := spec.SecurityContext, c.SecurityContext
	nonRoot := (psc != nil && psc.RunAsNonRoot != nil && *psc.RunAsNonRoot) || (sc != nil && sc.RunAsNonRoot != nil && *sc.RunAsNonRoot)
	if !nonRoot {
		t.Error("runAsNonRoot: want true")
	}
	for _, uid := range []*int64{podUser(psc), containerUser(sc)} {
		if uid != nil && *uid == 0 {
			t.Error("runAsUser: got 0, want a non-root user")
		}
	}
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Error("readOnlyRootFilesystem: want true")
	}
	if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Error("allowPrivilegeEscalation: want false")
	}
	if sc == nil || sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
		t.Error("capabilities: want drop ALL")
	}
	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if q := c.Resources.Requests[r]; q.IsZero() {
			t.Errorf("resources.requests.%s: want one", r)
		}
	}
	if q := c.Resources.Limits[corev1.ResourceMemory]; q.IsZero() {
		t.Error("resources.limits.memory: want one")
	}

	podLabels := labels.Set(w.dep.Spec.Template.Labels)
	sel, err := metav1.LabelSelectorAsSelector(w.dep.Spec.Selector)
	if err != nil || sel.Empty() || !sel.Matches(podLabels) {
		t.Errorf("Deployment selector %v: does not match its pod labels %v (%v)", w.dep.Spec.Selector, podLabels, err)
	}
	svc := w.m.services[0]
	if len(svc.Spec.Selector) == 0 || !labels.SelectorFromSet(svc.Spec.Selector).Matches(podLabels) {
		t.Errorf("Service %s selector %v: does not select the pods %v", svc.Name, svc.Spec.Selector, podLabels)
	}
	if len(svc.Spec.Ports) == 0 || !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return w.portMatches(p.TargetPort) }) {
		t.Errorf("Service %s ports %v: want one targeting the container port %d", svc.Name, svc.Spec.Ports, w.httpPort)
	}
	pdb := w.m.pdbs[0]
	psel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
	if err != nil || psel.Empty() || !psel.Matches(podLabels) {
		t.Errorf("PodDisruptionBudget %s selector %v: does not select the pods %v (%v)", pdb.Name, pdb.Spec.Selector, podLabels, err)
	}
	if pdb.Spec.MaxUnavailable == nil && pdb.Spec.MinAvailable == nil {
		t.Errorf("PodDisruptionBudget %s: want maxUnavailable or minAvailable", pdb.Name)
	}
}

func podUser(s *corev1.PodSecurityContext) *int64 {
	if s == nil {
		return nil
	}
	return s.RunAsUser
}

func containerUser(s *corev1.SecurityContext) *int64 {
	if s == nil {
		return nil
	}
	return s.RunAsUser
}

func ptrString[T any](p *T) string {
	if p == nil {
		return "unset"
	}
	return fmt.Sprint(*p)
}

// saslModes maps GATEKEEPER_KAFKA_SASL_MECHANISM to KEDA's kafka "sasl".
var saslModes = map[string]string{"": "none", "PLAIN": "plaintext", "SCRAM-SHA-256": "scram_sha256", "SCRAM-SHA-512": "scram_sha512"}

// TestK8sScaledObject checks that KEDA scales the Deployment on the lag of
// the source topics in the source group, and never on the retry tiers.
func TestK8sScaledObject(t *testing.T) {
	w := loadWiring(t)
	so := w.m.scaledObjects[0]
	ref := so.Spec.ScaleTargetRef
	if ref == nil || ref.Name != w.dep.Name || (ref.Kind != "" && ref.Kind != "Deployment") || (ref.APIVersion != "" && ref.APIVersion != "apps/v1") {
		t.Errorf("scaleTargetRef: got %+v, want Deployment %s", ref, w.dep.Name)
	}
	minR, maxR := so.Spec.MinReplicaCount, so.Spec.MaxReplicaCount
	if minR == nil || *minR < 1 {
		t.Errorf("minReplicaCount: got %s, want at least 1 (the retry role must keep running)", ptrString(minR))
	}
	if so.Spec.IdleReplicaCount != nil {
		t.Errorf("idleReplicaCount: got %d, want unset (no scaling to zero)", *so.Spec.IdleReplicaCount)
	}
	if minR != nil && maxR != nil && *maxR < *minR {
		t.Errorf("maxReplicaCount %d < minReplicaCount %d", *maxR, *minR)
	}

	group := w.env["GATEKEEPER_GROUP_ID"]
	sources := list(w.env["GATEKEEPER_SOURCE_TOPICS"])
	retry := w.env["GATEKEEPER_RETRY_TOPIC"]
	if retry == "" {
		retry = w.env["GATEKEEPER_DOWNSTREAM_TOPIC"] + ".retry"
	}
	if group == "" || len(sources) == 0 {
		t.Fatalf("ConfigMap %s: want GATEKEEPER_GROUP_ID and GATEKEEPER_SOURCE_TOPICS set", w.config.Name)
	}
	wantSASL := saslModes[w.env["GATEKEEPER_KAFKA_SASL_MECHANISM"]]
	wantTLS := "disable"
	if tlsOn, _ := strconv.ParseBool(w.env["GATEKEEPER_KAFKA_TLS"]); tlsOn {
		wantTLS = "enable"
	}
	var topics []string
	for i, tr := range so.Spec.Triggers {
		name := fmt.Sprintf("trigger %d (%s)", i, tr.Name)
		if tr.Type != "kafka" {
			t.Errorf("%s type: got %q, want kafka", name, tr.Type)
			continue
		}
		md := tr.Metadata
		for k, v := range md {
			if !kafkaTriggerMetadata[k] {
				t.Errorf("%s metadata %q: not a key of KEDA's kafka scaler", name, k)
			}
			if strings.Contains(v, retry) || v == group+".retry" {
				t.Errorf("%s metadata %s=%q: names a retry tier or the retry group; scale on the source lag only", name, k, v)
			}
		}
		if md["consumerGroup"] != group {
			t.Errorf("%s consumerGroup: got %q, want GATEKEEPER_GROUP_ID %q", name, md["consumerGroup"], group)
		}
		if md["topic"] == "" {
			t.Errorf("%s topic: empty, want one source topic", name)
		}
		topics = append(topics, md["topic"])
		if got, want := sortedList(md["bootstrapServers"]), sortedList(w.env["GATEKEEPER_KAFKA_BROKERS"]); !slices.Equal(got, want) {
			t.Errorf("%s bootstrapServers: got %v, want GATEKEEPER_KAFKA_BROKERS %v", name, got, want)
		}
		if got := cmpOr(md["sasl"], "none"); got != wantSASL {
			t.Errorf("%s sasl: got %q, want %q (GATEKEEPER_KAFKA_SASL_MECHANISM %q)", name, got, wantSASL, w.env["GATEKEEPER_KAFKA_SASL_MECHANISM"])
		}
		if got := cmpOr(md["tls"], "disable"); got != wantTLS {
			t.Errorf("%s tls: got %q, want %q (GATEKEEPER_KAFKA_TLS %q)", name, got, wantTLS, w.env["GATEKEEPER_KAFKA_TLS"])
		}
		if wantSASL != "none" {
			checkTriggerAuth(t, w, name, tr.AuthenticationRef)
		}
	}
	slices.Sort(topics)
	slices.Sort(sources)
	if !slices.Equal(topics, sources) {
		t.Errorf("trigger topics: got %v, want one per source topic %v", topics, sources)
	}
	if r := w.dep.Spec.Replicas; r != nil && minR != nil && maxR != nil && (*r < *minR || *r > *maxR) {
		t.Errorf("Deployment replicas %d: outside the ScaledObject's %d..%d", *r, *minR, *maxR)
	}
}

// checkTriggerAuth checks that the trigger authenticates with the SASL user
// and password of Gatekeeper's own Secret.
func checkTriggerAuth(t *testing.T, w *wiring, name string, ref *keda.AuthenticationRef) {
	t.Helper()
	if ref == nil || (ref.Kind != "" && ref.Kind != "TriggerAuthentication") {
		t.Errorf("%s authenticationRef: got %+v, want a TriggerAuthentication (SASL is on)", name, ref)
		return
	}
	ta := w.m.triggerAuths[ref.Name]
	if ta == nil {
		t.Errorf("%s authenticationRef %q: no such TriggerAuthentication", name, ref.Name)
		return
	}
	want := map[string]string{"username": "GATEKEEPER_KAFKA_SASL_USERNAME", "password": "GATEKEEPER_KAFKA_SASL_PASSWORD"}
	for _, r := range ta.Spec.SecretTargetRef {
		if r.Name != w.secret.Name {
			t.Errorf("TriggerAuthentication %s parameter %s: secret %q, want %q", ta.Name, r.Parameter, r.Name, w.secret.Name)
		}
		if _, ok := w.env[r.Key]; !ok {
			t.Errorf("TriggerAuthentication %s parameter %s: Secret %s has no key %q", ta.Name, r.Parameter, w.secret.Name, r.Key)
		}
		if k, ok := want[r.Parameter]; ok {
			if r.Key != k {
				t.Errorf("TriggerAuthentication %s parameter %s: key %q, want %q (what Gatekeeper uses)", ta.Name, r.Parameter, r.Key, k)
			}
			delete(want, r.Parameter)
		}
	}
	if len(want) > 0 {
		t.Errorf("TriggerAuthentication %s: missing parameters %v", ta.Name, mapKeys(want))
	}
}

func sortedList(s string) []string {
	l := list(s)
	slices.Sort(l)
	return l
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// ---- Compose ----

// loadComposeFile loads a compose file with compose-go, validating it
// against the Compose schema (unknown fields fail) and checking its
// consistency, with every profile enabled and an empty environment.
func loadComposeFile(t *testing.T, path string) (*types.Project, error) {
	t.Helper()
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return loader.LoadWithContext(ctx, types.ConfigDetails{
		WorkingDir:  filepath.Dir(abs),
		ConfigFiles: []types.ConfigFile{{Filename: abs}},
		Environment: types.Mapping{},
	}, loader.WithProfiles([]string{"*"}))
}

func composeEnv(s types.ServiceConfig) map[string]string {
	env := map[string]string{}
	for k, v := range s.Environment {
		if v != nil {
			env[k] = *v
		}
	}
	return env
}

// TestCompose checks compose.yaml: the services, the topics it creates
// against Gatekeeper's topics, the build, and Gatekeeper's environment
// against the binary's own check.
func TestCompose(t *testing.T) {
	p, err := loadComposeFile(t, composeFile)
	if err != nil {
		t.Fatalf("load %s: %v", composeFile, err)
	}
	for _, name := range []string{"kafka", "redis", "topics", "gatekeeper", "producer", "downstream"} {
		if _, ok := p.Services[name]; !ok {
			t.Errorf("service %q: missing (have %v)", name, mapKeys(p.Services))
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	kafka := p.Services["kafka"]
	if !strings.HasPrefix(kafka.Image, "apache/kafka:3.9.") {
		t.Errorf("kafka image: got %q, want apache/kafka:3.9.x", kafka.Image)
	}
	kenv := composeEnv(kafka)
	if !strings.Contains(kenv["KAFKA_PROCESS_ROLES"], "controller") {
		t.Errorf("kafka KAFKA_PROCESS_ROLES: got %q, want broker,controller (KRaft)", kenv["KAFKA_PROCESS_ROLES"])
	}

	gk := p.Services["gatekeeper"]
	env := composeEnv(gk)
	vars := configVars(t)
	for k := range env {
		if !vars[k] {
			t.Errorf("gatekeeper environment: %s is not a Gatekeeper variable", k)
		}
	}
	for _, b := range list(env["GATEKEEPER_KAFKA_BROKERS"]) {
		if !strings.Contains(kenv["KAFKA_ADVERTISED_LISTENERS"], "://"+b) {
			t.Errorf("GATEKEEPER_KAFKA_BROKERS %s: not among kafka's advertised listeners %q", b, kenv["KAFKA_ADVERTISED_LISTENERS"])
		}
	}

	// The topics service creates exactly Gatekeeper's topics, tiers included.
	down := env["GATEKEEPER_DOWNSTREAM_TOPIC"]
	retry := cmpOr(env["GATEKEEPER_RETRY_TOPIC"], down+".retry")
	want := append(list(env["GATEKEEPER_SOURCE_TOPICS"]), down, retry, retry+".1h", retry+".long", cmpOr(env["GATEKEEPER_DLQ_TOPIC"], down+".dlq"))
	slices.Sort(want)
	got := strings.Fields(composeEnv(p.Services["topics"])["TOPICS"])
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("topics service TOPICS: got %v, want %v", got, want)
	}
	if cmd := strings.Join(p.Services["topics"].Command, " "); !strings.Contains(cmd, "kafka-topics.sh") || !strings.Contains(cmd, "$TOPICS") {
		t.Errorf("topics service command: got %q, want kafka-topics.sh over $TOPICS", cmd)
	}
	wantDeps := map[string]string{"topics": types.ServiceConditionCompletedSuccessfully, "redis": types.ServiceConditionHealthy}
	for dep, cond := range wantDeps {
		if got := gk.DependsOn[dep].Condition; got != cond {
			t.Errorf("gatekeeper depends_on %s: got condition %q, want %q", dep, got, cond)
		}
	}
	if got := p.Services["producer"].DependsOn["topics"].Condition; got != types.ServiceConditionCompletedSuccessfully {
		t.Errorf("producer depends_on topics: got condition %q, want %q", got, types.ServiceConditionCompletedSuccessfully)
	}
	penv := composeEnv(p.Services["producer"])
	if !slices.Contains(list(env["GATEKEEPER_SOURCE_TOPICS"]), penv["PRODUCER_TOPIC"]) {
		t.Errorf("producer PRODUCER_TOPIC %q: not a source topic of gatekeeper (%s)", penv["PRODUCER_TOPIC"], env["GATEKEEPER_SOURCE_TOPICS"])
	}
	if penv["PRODUCER_BROKERS"] != env["GATEKEEPER_KAFKA_BROKERS"] {
		t.Errorf("producer PRODUCER_BROKERS: got %q, want gatekeeper's %q", penv["PRODUCER_BROKERS"], env["GATEKEEPER_KAFKA_BROKERS"])
	}

	// Both images come from deploy/docker/Dockerfile, each from its stage.
	stages := dockerStages(t)
	for name, target := range map[string]string{"gatekeeper": "gatekeeper", "producer": "producer"} {
		b := p.Services[name].Build
		if b == nil {
			t.Errorf("%s: want a build section", name)
			continue
		}
		df := filepath.Join(b.Context, b.Dockerfile)
		if abs, _ := filepath.Abs(dockerfile); df != abs {
			t.Errorf("%s build: got Dockerfile %s, want %s", name, df, abs)
		}
		if _, err := os.Stat(filepath.Join(b.Context, "go.mod")); err != nil {
			t.Errorf("%s build context %s: want the repository root (go.mod): %v", name, b.Context, err)
		}
		if b.Target != target || !slices.Contains(stages, target) {
			t.Errorf("%s build target: got %q, want %q among the Dockerfile's stages %v", name, b.Target, target, stages)
		}
	}

	// LIMITS_FILE lies in a read-only bind-mounted directory; check-config
	// reads it through the host path.
	limitsFile := env["GATEKEEPER_LIMITS_FILE"]
	var host string
	for _, v := range gk.Volumes {
		if v.Type == types.VolumeTypeBind && v.Target == filepath.Dir(limitsFile) {
			host = filepath.Join(v.Source, filepath.Base(limitsFile))
			if !v.ReadOnly {
				t.Errorf("gatekeeper volume %s: want read-only", v.Target)
			}
		}
	}
	if host == "" {
		t.Fatalf("gatekeeper: GATEKEEPER_LIMITS_FILE %q is not in a directory bind mount (a file mount misses edits)", limitsFile)
	}
	cenv := maps(env)
	cenv["GATEKEEPER_LIMITS_FILE"] = host
	checkConfig(t, cenv)

	grace := 25 * time.Second
	if s, ok := env["GATEKEEPER_SHUTDOWN_GRACE"]; ok {
		if grace, err = time.ParseDuration(s); err != nil {
			t.Fatal(err)
		}
	}
	if sg := gk.StopGracePeriod; sg == nil || time.Duration(*sg) <= grace {
		t.Errorf("gatekeeper stop_grace_period: got %v, want more than GATEKEEPER_SHUTDOWN_GRACE %v", ptrString(sg), grace)
	}
	if !gk.ReadOnly || gk.User == "" || strings.HasPrefix(gk.User, "0") || gk.User == "root" {
		t.Errorf("gatekeeper: got read_only %v user %q, want read_only and a non-root user", gk.ReadOnly, gk.User)
	}
}

// ---- Dockerfile ----

// dockerStages returns the stage names of the Dockerfile, in order.
func dockerStages(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(dockerfile)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range regexp.MustCompile(`(?mi)^FROM\s+\S+(?:\s+AS\s+(\S+))?`).FindAllStringSubmatch(string(data), -1) {
		names = append(names, m[1])
	}
	return names
}

// TestDockerfile checks the image's Dockerfile as text (there is no Docker
// engine to build it here): a static build stamped with the version, a
// distroless or scratch final stage running as a non-root user, the HTTP
// port, and /gatekeeper run as the entry point.
func TestDockerfile(t *testing.T) {
	data, err := os.ReadFile(dockerfile)
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	// Stages: FROM lines split the file.
	froms := regexp.MustCompile(`(?mi)^FROM\s`).FindAllStringIndex(text, -1)
	if len(froms) < 2 {
		t.Fatalf("%s: got %d stages, want a multi-stage build", dockerfile, len(froms))
	}
	final := text[froms[len(froms)-1][0]:]
	var build string
	for i, f := range froms {
		end := len(text)
		if i+1 < len(froms) {
			end = froms[i+1][0]
		}
		if s := text[f[0]:end]; strings.Contains(s, "./cmd/gatekeeper") {
			build = s
		}
	}
	for _, want := range []string{"FROM golang:", "CGO_ENABLED=0", "-X main.version="} {
		if !strings.Contains(build, want) {
			t.Errorf("the stage building ./cmd/gatekeeper: no %q", want)
		}
	}
	if main, err := os.ReadFile("../cmd/gatekeeper/main.go"); err != nil || !regexp.MustCompile(`(?m)^var version = `).Match(main) {
		t.Errorf("cmd/gatekeeper/main.go: want `var version = ...` for -X main.version (%v)", err)
	}
	from := strings.Fields(strings.SplitN(final, "\n", 2)[0])[1]
	if !strings.Contains(from, "distroless/static") && from != "scratch" {
		t.Errorf("final stage FROM %s: want distroless/static or scratch", from)
	}
	user := regexp.MustCompile(`(?m)^USER\s+(\S+)`).FindStringSubmatch(final)
	if user == nil || !regexp.MustCompile(`^[1-9][0-9]*(:[0-9]+)?$`).MatchString(user[1]) {
		t.Errorf("final stage USER: got %v, want a numeric non-root user (runAsNonRoot can only verify a number)", user)
	}
	w := loadWiring(t)
	if !regexp.MustCompile(fmt.Sprintf(`(?m)^EXPOSE\s+%d\b`, w.httpPort)).MatchString(final) {
		t.Errorf("final stage: want EXPOSE %d (GATEKEEPER_HTTP_ADDR)", w.httpPort)
	}
	for _, want := range []string{`ENTRYPOINT ["/gatekeeper"]`, `CMD ["run"]`} {
		if !strings.Contains(final, want) {
			t.Errorf("final stage: want %s", want)
		}
	}
	if !strings.Contains(final, "/gatekeeper") || !strings.Contains(final, "COPY --from=") {
		t.Error("final stage: want the binary copied in as /gatekeeper")
	}
	if _, err := os.Stat("compose/producer/main.go"); err != nil || !strings.Contains(text, "./deploy/compose/producer") {
		t.Errorf("the producer stage must build ./deploy/compose/producer (%v)", err)
	}
	ignore, err := os.ReadFile(dockerfile + ".dockerignore")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{".git", ".local"} {
		if !slices.Contains(strings.Fields(string(ignore)), want) {
			t.Errorf("%s.dockerignore: want %s left out of the context", dockerfile, want)
		}
	}
}
