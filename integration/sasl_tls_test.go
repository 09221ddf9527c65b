package integration

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"

	"github.com/gatekeeper-dev/gatekeeper/internal/testenv"
)

// The SASL and TLS test runs the binary against servers that take only
// encrypted, authenticated connections: a private Kafka broker with two
// SASL_SSL listeners (PLAIN and SCRAM-SHA-512 on both; SECURE checks the
// broker's certificate only, MTLS demands a client certificate) and a
// TLS-only redis-server that demands client certificates. The CA and every
// certificate are made by the test. The broker also has a PLAINTEXT
// listener, for the test's own set-up and reads (and for kafka.sh's check
// that the broker serves); Gatekeeper is given only the SASL_SSL address,
// and the broker's metadata on that listener names only SASL_SSL addresses.

const (
	saslPlainUser, saslPlainPassword = "gk-plain", "plain-secret-1"
	saslScramUser, saslScramPassword = "gk-scram", "scram-secret-1"
)

// secureSetup is the test's CA, certificates and keys (as files) and the
// addresses of its private servers.
type secureSetup struct {
	dir                      string
	ca                       string // the CA certificate
	brokerKeystore           string // key and certificate chain, for ssl.keystore.type=PEM
	server, serverKey        string // the same certificate and key, for redis-server
	client, clientKey        string
	caPool                   *x509.CertPool
	clientPair               tls.Certificate
	brokerSecure, brokerMTLS string // SASL_SSL addresses: SECURE and MTLS listeners
	brokerPlain              string // the PLAINTEXT listener, for the test's set-up
	redis                    string // the TLS port of redis-server
}

// newSecureSetup makes the CA, a server certificate for 127.0.0.1 and
// localhost (the broker's and redis-server's) and a client certificate, and
// writes them to a temporary directory.
func newSecureSetup(t *testing.T) *secureSetup {
	dir := t.TempDir()
	ca := testenv.NewCA(t, "gatekeeper test CA")
	server := ca.ServerCert(t)
	client := ca.ClientCert(t, "gatekeeper")
	f := &secureSetup{dir: dir, caPool: x509.NewCertPool()}
	f.caPool.AddCert(ca.Cert)
	f.ca = testenv.WriteFile(t, dir, "ca.pem", ca.CertPEM)
	chain := append(append([]byte{}, server.CertPEM...), ca.CertPEM...)
	f.brokerKeystore = testenv.WriteFile(t, dir, "broker-keystore.pem", append(append([]byte{}, server.KeyPEM...), chain...))
	f.server = testenv.WriteFile(t, dir, "server.pem", chain)
	f.serverKey = testenv.WriteFile(t, dir, "server-key.pem", server.KeyPEM)
	f.client = testenv.WriteFile(t, dir, "client.pem", client.CertPEM)
	f.clientKey = testenv.WriteFile(t, dir, "client-key.pem", client.KeyPEM)
	pair, err := tls.X509KeyPair(client.CertPEM, client.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	f.clientPair = pair
	return f
}

// tlsConfig is a client configuration that trusts the test's CA, with the
// client certificate when withCert.
func (f *secureSetup) tlsConfig(withCert bool) *tls.Config {
	c := &tls.Config{RootCAs: f.caPool, MinVersion: tls.VersionTLS12}
	if withCert {
		c.Certificates = []tls.Certificate{f.clientPair}
	}
	return c
}

// TestSASLTLS runs Gatekeeper over SASL_SSL (PLAIN with the CA file, then
// SCRAM-SHA-512 with the CA file and a client certificate) and a TLS Redis
// with a client certificate, and checks that every event is admitted or
// deferred end to end and the source offsets are committed. It first checks
// that the servers refuse what they should, so that a pass means the
// settings were used.
func TestSASLTLS(t *testing.T) {
	t.Parallel()
	f := newSecureSetup(t)
	startSecureBroker(t, f)
	startTLSRedis(t, f)
	t.Run("servers refuse", func(t *testing.T) { checkSecureRefusals(t, f) })
	tests := []struct {
		name, mech, user, password, broker string
		clientCert                         bool
	}{
		{"PLAIN, CA file", "PLAIN", saslPlainUser, saslPlainPassword, f.brokerSecure, false},
		{"SCRAM-SHA-512, CA file and client certificate", "SCRAM-SHA-512", saslScramUser, saslScramPassword, f.brokerMTLS, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			env := map[string]string{
				"GATEKEEPER_KAFKA_BROKERS":        tt.broker,
				"GATEKEEPER_KAFKA_TLS":            "true",
				"GATEKEEPER_KAFKA_TLS_CA_FILE":    f.ca,
				"GATEKEEPER_KAFKA_SASL_MECHANISM": tt.mech,
				"GATEKEEPER_KAFKA_SASL_USERNAME":  tt.user,
				"GATEKEEPER_KAFKA_SASL_PASSWORD":  tt.password,
				"GATEKEEPER_REDIS_ADDRS":          f.redis,
				"GATEKEEPER_REDIS_TLS":            "true",
				"GATEKEEPER_REDIS_TLS_CA_FILE":    f.ca,
				"GATEKEEPER_REDIS_TLS_CERT_FILE":  f.client,
				"GATEKEEPER_REDIS_TLS_KEY_FILE":   f.clientKey,
			}
			if tt.clientCert {
				env["GATEKEEPER_KAFKA_TLS_CERT_FILE"] = f.client
				env["GATEKEEPER_KAFKA_TLS_KEY_FILE"] = f.clientKey
			}
			runSecurePipeline(t, f, env)
		})
	}
}

// runSecurePipeline runs one gatekeeper with env over a flow of its own on
// the private broker: 20 events of a tenant with room and 10 of a tenant
// with room for 3 in its hour-long ttl window.
func runSecurePipeline(t *testing.T, f *secureSetup, env map[string]string) {
	fl := secCreateFlow(t, f.brokerPlain)
	for k, v := range fl.env(t, "GATEKEEPER_WINDOW", "ttl", "GATEKEEPER_LIMITS", "*=1000/1h;capped=3/1h") {
		env[k] = v
	}
	t0 := time.Now()
	gk := startGatekeeper(t, "gk", env)
	gk.waitReady(60 * time.Second)
	t.Logf("ready after %v", time.Since(t0).Round(time.Millisecond))
	var msgs []kafka.Message
	for i := range 30 {
		tenant := "free"
		if i%3 == 0 {
			tenant = "capped"
		}
		msgs = append(msgs, kafka.Message{Partition: i % 3, Key: []byte(tenant), Value: []byte(strconv.Itoa(i))})
	}
	secProduce(t, f.brokerPlain, fl.Source, msgs)
	var down, retry, dlq map[string]int
	waitFor(t, 60*time.Second, "events routed and committed", func() (bool, string) {
		down = secCountByKey(t, f.brokerPlain, fl.Downstream)
		retry = secCountByKey(t, f.brokerPlain, fl.Retry, fl.Retry+".1h", fl.Retry+".long")
		dlq = secCountByKey(t, f.brokerPlain, fl.DLQ)
		done := secSum(committedAt(t, &kafka.Client{Addr: kafka.TCP(f.brokerPlain), Timeout: 30 * time.Second}, env["GATEKEEPER_GROUP_ID"], fl.Source, 3))
		return done == 30 && down["free"]+down["capped"]+retry["capped"] == 30,
			fmt.Sprintf("downstream %v, retry %v, dlq %v, committed %d of 30", down, retry, dlq, done)
	})
	t.Logf("routed and committed after %v", time.Since(t0).Round(time.Millisecond))
	if down["free"] != 20 || down["capped"] != 3 || retry["capped"] != 7 || len(dlq) != 0 {
		t.Errorf("got downstream %v, retry %v, dead letters %v; want downstream free:20 capped:3, retry capped:7, none dead",
			down, retry, dlq)
	}
	if code, took := gk.terminate(30 * time.Second); code != 0 {
		t.Errorf("exit code after SIGTERM: got %d, want 0 (took %v)", code, took)
	}
}

// checkSecureRefusals checks that the MTLS listener refuses a client without
// a certificate, that a wrong password or a connection without TLS is
// refused, and that Redis refuses a client without a certificate.
func checkSecureRefusals(t *testing.T, f *secureSetup) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	scramMech := func(password string) sasl.Mechanism {
		m, err := scram.Mechanism(scram.SHA512, saslScramUser, password)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	tests := []struct {
		name   string
		addr   string
		tls    *tls.Config
		mech   sasl.Mechanism
		wantOK bool
	}{
		{"SECURE: PLAIN with the CA", f.brokerSecure, f.tlsConfig(false), plain.Mechanism{Username: saslPlainUser, Password: saslPlainPassword}, true},
		{"SECURE: wrong PLAIN password", f.brokerSecure, f.tlsConfig(false), plain.Mechanism{Username: saslPlainUser, Password: "wrong"}, false},
		{"SECURE: without TLS", f.brokerSecure, nil, plain.Mechanism{Username: saslPlainUser, Password: saslPlainPassword}, false},
		{"MTLS: SCRAM with a client certificate", f.brokerMTLS, f.tlsConfig(true), scramMech(saslScramPassword), true},
		{"MTLS: SCRAM without a client certificate", f.brokerMTLS, f.tlsConfig(false), scramMech(saslScramPassword), false},
		{"MTLS: wrong SCRAM password", f.brokerMTLS, f.tlsConfig(true), scramMech("wrong"), false},
	}
	for _, tt := range tests {
		d := &kafka.Dialer{Timeout: 5 * time.Second, TLS: tt.tls, SASLMechanism: tt.mech}
		err := secMetadata(ctx, d, tt.addr)
		if (err == nil) != tt.wantOK {
			t.Errorf("%s: got error %v, want success %v", tt.name, err, tt.wantOK)
		}
	}
	for _, withCert := range []bool{true, false} {
		rdb := redis.NewClient(&redis.Options{Addr: f.redis, TLSConfig: f.tlsConfig(withCert), MaxRetries: -1, DialTimeout: 5 * time.Second})
		err := rdb.Ping(ctx).Err()
		rdb.Close()
		if (err == nil) != withCert {
			t.Errorf("redis PING, client certificate %v: got error %v, want success %v", withCert, err, withCert)
		}
	}
}

// secMetadata asks addr for the cluster's brokers through d.
func secMetadata(ctx context.Context, d *kafka.Dialer, addr string) error {
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	_, err = conn.Brokers()
	return err
}

// startSecureBroker starts the private broker with deploy/local/kafka.sh
// (the release of GATEKEEPER_TEST_KAFKA_VERSION, else the script's), its
// SASL_SSL listeners added through KAFKA_EXTRA_CONFIG and the SCRAM user
// created at format time through KAFKA_FORMAT_ARGS. It kills the broker when
// the test ends.
func startSecureBroker(t *testing.T, f *secureSetup) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range []string{"java", "mvn"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not on PATH: the private SASL_SSL broker runs from the Maven jars (deploy/local/kafka.sh)", tool)
		}
	}
	ports := secFreePorts(t, 4)
	plainPort, securePort, mtlsPort, ctrlPort := ports[0], ports[1], ports[2], ports[3]
	f.brokerPlain = "127.0.0.1:" + strconv.Itoa(plainPort)
	f.brokerSecure = "127.0.0.1:" + strconv.Itoa(securePort)
	f.brokerMTLS = "127.0.0.1:" + strconv.Itoa(mtlsPort)
	extra := testenv.WriteFile(t, f.dir, "secure.properties", []byte(secureBrokerConfig(f, plainPort, securePort, mtlsPort, ctrlPort)))
	kdir := filepath.Join(f.dir, "kafka")
	if err := os.MkdirAll(kdir, 0o755); err != nil {
		t.Fatal(err)
	}
	secReuseClasspath(root, kdir)
	cmd := exec.Command(filepath.Join(root, "deploy", "local", "kafka.sh"), "start")
	cmd.Env = append(os.Environ(), "KAFKA_PORT="+strconv.Itoa(plainPort), "KAFKA_CONTROLLER_PORT="+strconv.Itoa(ctrlPort),
		"KAFKA_DIR="+kdir, "KAFKA_EXTRA_CONFIG="+extra,
		"KAFKA_FORMAT_ARGS=--add-scram SCRAM-SHA-512=[name="+saslScramUser+",password="+saslScramPassword+"]")
	if v := os.Getenv("GATEKEEPER_TEST_KAFKA_VERSION"); v != "" {
		cmd.Env = append(cmd.Env, "KAFKA_VERSION="+v)
	}
	cmd.WaitDelay = 5 * time.Second
	t0 := time.Now()
	t.Cleanup(func() { secKillPidFile(t, filepath.Join(kdir, "kafka.pid")) })
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("private SASL_SSL broker: deploy/local/kafka.sh start: %v\n%s", err, out)
	}
	t.Logf("deploy/local/kafka.sh start:\n%s", out)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := testenv.WarmUpGroupCoordinator(ctx, f.brokerPlain, "gkt-sec-warm-up"); err != nil {
		t.Fatalf("private SASL_SSL broker: group coordinator: %v", err)
	}
	t.Logf("private SASL_SSL broker (%s) serving after %v", secBrokerVersion(kdir), time.Since(t0).Round(time.Millisecond))
}

// secureBrokerConfig are the broker properties that replace kafka.sh's
// listeners: PLAINTEXT for the test, SECURE and MTLS (SASL_SSL), and the
// controller's.
func secureBrokerConfig(f *secureSetup, plainPort, securePort, mtlsPort, ctrlPort int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "listeners=PLAINTEXT://127.0.0.1:%d,SECURE://127.0.0.1:%d,MTLS://127.0.0.1:%d,CONTROLLER://127.0.0.1:%d\n",
		plainPort, securePort, mtlsPort, ctrlPort)
	fmt.Fprintf(&b, "advertised.listeners=PLAINTEXT://127.0.0.1:%d,SECURE://127.0.0.1:%d,MTLS://127.0.0.1:%d\n",
		plainPort, securePort, mtlsPort)
	b.WriteString("listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SECURE:SASL_SSL,MTLS:SASL_SSL\n")
	b.WriteString("sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-512\n")
	fmt.Fprintf(&b, "ssl.keystore.type=PEM\nssl.keystore.location=%s\n", f.brokerKeystore)
	fmt.Fprintf(&b, "ssl.truststore.type=PEM\nssl.truststore.location=%s\n", f.ca)
	b.WriteString("listener.name.mtls.ssl.client.auth=required\n")
	for _, l := range []string{"secure", "mtls"} {
		fmt.Fprintf(&b, "listener.name.%s.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_%s=\"%s\";\n",
			l, saslPlainUser, saslPlainPassword)
		fmt.Fprintf(&b, "listener.name.%s.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;\n", l)
	}
	return b.String()
}

// secReuseClasspath copies the classpath kafka.sh resolved for the shared
// broker of the same release, when there is one, so that Maven is not run
// again (kafka.sh checks that it names the release and its jars exist).
func secReuseClasspath(root, kdir string) {
	version := os.Getenv("KAFKA_VERSION")
	if version == "" {
		version = os.Getenv("GATEKEEPER_TEST_KAFKA_VERSION")
	}
	local := os.Getenv("GATEKEEPER_LOCAL_DIR")
	if local == "" {
		local = filepath.Join(root, ".local")
	}
	if version == "" {
		return
	}
	if cp, err := os.ReadFile(filepath.Join(local, "kafka-"+version, "classpath")); err == nil {
		os.WriteFile(filepath.Join(kdir, "classpath"), cp, 0o644)
	}
}

// secBrokerVersion is the release the broker logged at start-up.
func secBrokerVersion(kdir string) string {
	log, _ := os.ReadFile(filepath.Join(kdir, "kafka.log"))
	if _, v, ok := strings.Cut(string(log), "Kafka version: "); ok {
		return "Kafka " + strings.Fields(v)[0]
	}
	return "Kafka of unknown release"
}

// secKillPidFile kills the process named in a pid file (a private broker runs
// detached, so it is not a child of the test) and waits until it is gone.
func secKillPidFile(t *testing.T, file string) {
	b, err := os.ReadFile(file)
	if err != nil {
		return
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return
	}
	syscall.Kill(pid, syscall.SIGKILL)
	for range 100 {
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("private broker pid %d still there 10s after SIGKILL", pid)
}

// startTLSRedis starts a redis-server that listens on a TLS port only and
// demands client certificates signed by the test's CA, and kills it when
// the test ends.
func startTLSRedis(t *testing.T, f *secureSetup) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server is not on PATH (deploy/local/redis.sh start installs it)")
	}
	port := strconv.Itoa(secFreePorts(t, 1)[0])
	f.redis = "127.0.0.1:" + port
	cmd := exec.Command("redis-server", "--port", "0", "--tls-port", port, "--bind", "127.0.0.1",
		"--tls-cert-file", f.server, "--tls-key-file", f.serverKey, "--tls-ca-cert-file", f.ca,
		"--tls-auth-clients", "yes", "--save", "", "--appendonly", "no", "--dir", f.dir)
	out := &strings.Builder{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start redis-server: %v", err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-done })
	rdb := redis.NewClient(&redis.Options{Addr: f.redis, TLSConfig: f.tlsConfig(true), MaxRetries: -1, DialTimeout: time.Second})
	defer rdb.Close()
	waitFor(t, 20*time.Second, "TLS redis-server answers", func() (bool, string) {
		select {
		case <-done:
			t.Fatalf("redis-server on TLS port %s exited at start (built without TLS?):\n%s", port, out)
		default:
		}
		err := rdb.Ping(context.Background()).Err()
		return err == nil, fmt.Sprint(err)
	})
}

// secFreePorts returns n loopback ports that were free just now, all different.
func secFreePorts(t *testing.T, n int) []int {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close() // held until all are chosen
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

// secCreateFlow creates a flow's topics on the broker at addr and waits
// until every partition has an acting leader.
func secCreateFlow(t *testing.T, addr string) flow {
	name := "gkt-" + uniqueName(t)
	fl := flow{Source: name, Downstream: name + ".out"}
	fl.Retry, fl.DLQ = fl.Downstream+".retry", fl.Downstream+".dlq"
	c := &kafka.Client{Addr: kafka.TCP(addr), Timeout: 30 * time.Second}
	var topics []kafka.TopicConfig
	for _, name := range []string{fl.Source, fl.Downstream, fl.Retry, fl.Retry + ".1h", fl.Retry + ".long", fl.DLQ} {
		topics = append(topics, kafka.TopicConfig{Topic: name, NumPartitions: 3, ReplicationFactor: 1})
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	res, err := c.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: topics})
	if err != nil {
		t.Fatalf("create topics: %v", err)
	}
	for _, tc := range topics {
		if err := res.Errors[tc.Topic]; err != nil {
			t.Fatalf("create topic %s: %v", tc.Topic, err)
		}
		req := &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{}}
		for p := range tc.NumPartitions {
			req.Topics[tc.Topic] = append(req.Topics[tc.Topic], kafka.LastOffsetOf(p))
		}
		waitFor(t, time.Minute, "topic "+tc.Topic+" served", func() (bool, string) {
			res, err := c.ListOffsets(ctx, req)
			if err == nil {
				for _, p := range res.Topics[tc.Topic] {
					err = errors.Join(err, p.Error)
				}
			}
			return err == nil && len(res.Topics[tc.Topic]) == tc.NumPartitions, fmt.Sprint(err)
		})
	}
	return fl
}

// secProduce writes msgs to topic on the broker at addr, each to the
// partition it names.
func secProduce(t *testing.T, addr, topic string, msgs []kafka.Message) {
	w := partitionWriter(topic)
	w.Addr = kafka.TCP(addr)
	defer w.Close()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatalf("produce to %s: %v", topic, err)
	}
}

// secCountByKey counts the messages of topics on the broker at addr by key.
func secCountByKey(t *testing.T, addr string, topics ...string) map[string]int {
	out := map[string]int{}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for _, topic := range topics {
		for p := range 3 {
			conn, err := kafka.DialLeader(ctx, "tcp", addr, topic, p)
			if err != nil {
				t.Fatalf("dial %s/%d: %v", topic, p, err)
			}
			conn.SetDeadline(time.Now().Add(20 * time.Second))
			first, last, err := conn.ReadOffsets()
			if err == nil && last > first {
				err = secReadKeys(conn, first, last, out)
			}
			conn.Close()
			if err != nil {
				t.Fatalf("read %s/%d: %v", topic, p, err)
			}
		}
	}
	return out
}

// secReadKeys counts the keys of the messages from first to last (exclusive).
func secReadKeys(conn *kafka.Conn, first, last int64, out map[string]int) error {
	for off := first; off < last; {
		if _, err := conn.Seek(off, kafka.SeekAbsolute); err != nil {
			return err
		}
		batch := conn.ReadBatch(1, 10<<20)
		from := off
		for off < last {
			m, err := batch.ReadMessage()
			if err != nil {
				break
			}
			out[string(m.Key)]++
			off = m.Offset + 1
		}
		if err := batch.Close(); err != nil || off == from {
			return fmt.Errorf("at offset %d of %d: %v", off, last, err)
		}
	}
	return nil
}

func secSum(m map[int]int64) int64 {
	var s int64
	for _, v := range m {
		s += max(v, 0)
	}
	return s
}
