package worker

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gatekeeper-dev/gatekeeper/internal/testenv"
)

// tlsTestFiles are the certificates and keys the TLS tests load, written to
// a test's temporary directory.
type tlsTestFiles struct {
	dir                        string
	ca, otherCA                *testenv.CA
	caFile, otherCAFile        string
	serverCert                 testenv.Cert // signed by ca, for 127.0.0.1
	clientFile, clientKeyFile  string       // signed by ca
	otherKeyFile               string       // the key of another certificate
	secret                     string       // a line in garbage files that no error may quote
	garbageFile, bigFile, fifo string
}

func newTLSTestFiles(t *testing.T) *tlsTestFiles {
	dir := t.TempDir()
	f := &tlsTestFiles{dir: dir, ca: testenv.NewCA(t, "test CA"), otherCA: testenv.NewCA(t, "other CA"),
		secret: "root:x:0:0:hunter2:/root:/bin/bash"}
	f.caFile = testenv.WriteFile(t, dir, "ca.pem", f.ca.CertPEM)
	f.otherCAFile = testenv.WriteFile(t, dir, "other-ca.pem", f.otherCA.CertPEM)
	f.serverCert = f.ca.ServerCert(t)
	client := f.ca.ClientCert(t, "gatekeeper")
	f.clientFile = testenv.WriteFile(t, dir, "client.pem", client.CertPEM)
	f.clientKeyFile = testenv.WriteFile(t, dir, "client-key.pem", client.KeyPEM)
	f.otherKeyFile = testenv.WriteFile(t, dir, "other-key.pem", f.ca.ClientCert(t, "other").KeyPEM)
	f.garbageFile = testenv.WriteFile(t, dir, "passwd", []byte(f.secret+"\n"))
	f.bigFile = testenv.WriteFile(t, dir, "big.pem", []byte(strings.Repeat(string(f.ca.CertPEM), maxTLSFile/len(f.ca.CertPEM)+1)))
	f.fifo = filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(f.fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// write writes a file of the test's directory and returns its path.
func (f *tlsTestFiles) write(t *testing.T, name string, data []byte) string {
	return testenv.WriteFile(t, f.dir, name, data)
}

// TestTLSFilesHandshake checks the configurations the TLS variables give
// against a TLS server in the test that demands a client certificate: the
// CA file's CA is trusted, nothing else is (the system's CAs included), and
// the client certificate is presented.
func TestTLSFilesHandshake(t *testing.T) {
	f := newTLSTestFiles(t)
	addr := startTLSServer(t, f.serverCert, f.ca)
	otherServer := startTLSServer(t, f.otherCA.ServerCert(t), f.ca)
	tests := []struct {
		name   string
		env    map[string]string
		addr   string
		wantOK bool
	}{
		{"kafka: CA and client certificate", with(minimal(), "KAFKA_TLS", "true", "KAFKA_TLS_CA_FILE", f.caFile,
			"KAFKA_TLS_CERT_FILE", f.clientFile, "KAFKA_TLS_KEY_FILE", f.clientKeyFile), addr, true},
		{"kafka: no client certificate", with(minimal(), "KAFKA_TLS", "true", "KAFKA_TLS_CA_FILE", f.caFile), addr, false},
		{"kafka: server of another CA", with(minimal(), "KAFKA_TLS", "true", "KAFKA_TLS_CA_FILE", f.caFile,
			"KAFKA_TLS_CERT_FILE", f.clientFile, "KAFKA_TLS_KEY_FILE", f.clientKeyFile), otherServer, false},
		{"kafka: the system's CAs", with(minimal(), "KAFKA_TLS", "true",
			"KAFKA_TLS_CERT_FILE", f.clientFile, "KAFKA_TLS_KEY_FILE", f.clientKeyFile), addr, false},
		{"redis: CA and client certificate", with(minimal(), "REDIS_TLS", "true", "REDIS_TLS_CA_FILE", f.caFile,
			"REDIS_TLS_CERT_FILE", f.clientFile, "REDIS_TLS_KEY_FILE", f.clientKeyFile), addr, true},
		{"redis: CA of another server", with(minimal(), "REDIS_TLS", "true", "REDIS_TLS_CA_FILE", f.otherCAFile,
			"REDIS_TLS_CERT_FILE", f.clientFile, "REDIS_TLS_KEY_FILE", f.clientKeyFile), addr, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			setEnv(t, tt.env)
			cfg, err := LoadConfig()
			if err != nil {
				t.Fatalf("got %v, want no error", err)
			}
			var tc *tls.Config
			if strings.HasPrefix(tt.name, "kafka") {
				d, err := NewKafkaDialer(cfg)
				if err != nil {
					t.Fatal(err)
				}
				tc = d.TLS
			} else {
				tc = cfg.redisTLSConfig()
			}
			if tc == nil {
				t.Fatal("got no TLS configuration, want one")
			}
			err = handshake(tt.addr, tc)
			if (err == nil) != tt.wantOK {
				t.Errorf("handshake: got error %v, want success %v", err, tt.wantOK)
			}
		})
	}
}

// startTLSServer serves TLS with cert on a loopback port, demanding a client
// certificate signed by clientCA, and returns its address. Each connection
// completes its handshake, then is closed.
func startTLSServer(t *testing.T, cert testenv.Cert, clientCA *testenv.CA) string {
	pair, err := tls.X509KeyPair(cert.CertPEM, cert.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(clientCA.Cert)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{pair},
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(5 * time.Second))
				if c.(*tls.Conn).Handshake() == nil {
					c.Write([]byte("ok")) // the client reads it once the server accepted its certificate
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// handshake connects to addr with cfg (ServerName from addr, as kafka-go and
// go-redis set it) and reads the server's "ok": with TLS 1.3 a refused
// client certificate shows only on the first read.
func handshake(addr string, cfg *tls.Config) error {
	host, _, _ := net.SplitHostPort(addr)
	cfg = cfg.Clone()
	cfg.ServerName = host
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 2)
	_, err = c.Read(buf)
	return err
}

// TestTLSFilesErrors checks that every bad TLS setting stops start-up with
// one line naming the variable, and that no error quotes a file's content.
func TestTLSFilesErrors(t *testing.T) {
	f := newTLSTestFiles(t)
	keyInCA := f.write(t, "key-in-ca.pem", append(append([]byte{}, f.ca.CertPEM...), f.serverCert.KeyPEM...))
	expired := f.ca.Issue(t, testenv.CertSpec{CommonName: "old", NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-time.Hour)})
	future := f.ca.Issue(t, testenv.CertSpec{CommonName: "new", NotBefore: time.Now().Add(time.Hour), NotAfter: time.Now().Add(48 * time.Hour)})
	serverOnly := f.ca.ServerCert(t)
	encrypted := f.write(t, "encrypted-key.pem", pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY",
		Headers: map[string]string{"Proc-Type": "4,ENCRYPTED", "DEK-Info": "AES-128-CBC,00000000000000000000000000000000"}, Bytes: []byte("x")}))
	badKey := f.write(t, "bad-key.pem", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte(f.secret)}))
	badCert := f.write(t, "bad-cert.pem", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte(f.secret)}))
	kafkaMTLS := func(kv ...string) map[string]string {
		return with(with(minimal(), "KAFKA_TLS", "true", "KAFKA_TLS_CERT_FILE", f.clientFile, "KAFKA_TLS_KEY_FILE", f.clientKeyFile), kv...)
	}
	tests := []struct {
		name    string
		env     map[string]string
		wantVar string
	}{
		{"kafka CA without TLS", with(minimal(), "KAFKA_TLS_CA_FILE", f.caFile), "KAFKA_TLS_CA_FILE"},
		{"kafka certificate without TLS", with(minimal(), "KAFKA_TLS_CERT_FILE", f.clientFile, "KAFKA_TLS_KEY_FILE", f.clientKeyFile), "KAFKA_TLS_CERT_FILE"},
		{"redis key without TLS", with(minimal(), "REDIS_TLS_KEY_FILE", f.clientKeyFile), "REDIS_TLS_KEY_FILE"},
		{"certificate without key", with(minimal(), "KAFKA_TLS", "true", "KAFKA_TLS_CERT_FILE", f.clientFile), "KAFKA_TLS_KEY_FILE"},
		{"key without certificate", with(minimal(), "REDIS_TLS", "true", "REDIS_TLS_KEY_FILE", f.clientKeyFile), "REDIS_TLS_CERT_FILE"},
		{"missing CA file", with(minimal(), "KAFKA_TLS", "true", "KAFKA_TLS_CA_FILE", filepath.Join(f.dir, "missing.pem")), "KAFKA_TLS_CA_FILE"},
		{"CA file not PEM", with(minimal(), "REDIS_TLS", "true", "REDIS_TLS_CA_FILE", f.garbageFile), "REDIS_TLS_CA_FILE"},
		{"CA file with a key", with(minimal(), "KAFKA_TLS", "true", "KAFKA_TLS_CA_FILE", keyInCA), "KAFKA_TLS_CA_FILE"},
		{"CA file a directory", with(minimal(), "KAFKA_TLS", "true", "KAFKA_TLS_CA_FILE", f.dir), "KAFKA_TLS_CA_FILE"},
		{"CA file a FIFO", with(minimal(), "KAFKA_TLS", "true", "KAFKA_TLS_CA_FILE", f.fifo), "KAFKA_TLS_CA_FILE"},
		{"CA file too large", with(minimal(), "REDIS_TLS", "true", "REDIS_TLS_CA_FILE", f.bigFile), "REDIS_TLS_CA_FILE"},
		{"CA file bad certificate", with(minimal(), "KAFKA_TLS", "true", "KAFKA_TLS_CA_FILE", badCert), "KAFKA_TLS_CA_FILE"},
		{"certificate not PEM", kafkaMTLS("KAFKA_TLS_CERT_FILE", f.garbageFile), "KAFKA_TLS_CERT_FILE"},
		{"certificate a FIFO", kafkaMTLS("KAFKA_TLS_CERT_FILE", f.fifo), "KAFKA_TLS_CERT_FILE"},
		{"certificate expired", kafkaMTLS("KAFKA_TLS_CERT_FILE", f.write(t, "expired.pem", expired.CertPEM),
			"KAFKA_TLS_KEY_FILE", f.write(t, "expired-key.pem", expired.KeyPEM)), "KAFKA_TLS_CERT_FILE"},
		{"certificate not yet valid", kafkaMTLS("KAFKA_TLS_CERT_FILE", f.write(t, "future.pem", future.CertPEM),
			"KAFKA_TLS_KEY_FILE", f.write(t, "future-key.pem", future.KeyPEM)), "KAFKA_TLS_CERT_FILE"},
		{"certificate for servers only", kafkaMTLS("KAFKA_TLS_CERT_FILE", f.write(t, "server.pem", serverOnly.CertPEM),
			"KAFKA_TLS_KEY_FILE", f.write(t, "server-key.pem", serverOnly.KeyPEM)), "KAFKA_TLS_CERT_FILE"},
		{"key not PEM", kafkaMTLS("KAFKA_TLS_KEY_FILE", f.garbageFile), "KAFKA_TLS_KEY_FILE"},
		{"key a certificate", kafkaMTLS("KAFKA_TLS_KEY_FILE", f.clientFile), "KAFKA_TLS_KEY_FILE"},
		{"key does not parse", kafkaMTLS("KAFKA_TLS_KEY_FILE", badKey), "KAFKA_TLS_KEY_FILE"},
		{"key encrypted", kafkaMTLS("KAFKA_TLS_KEY_FILE", encrypted), "KAFKA_TLS_KEY_FILE"},
		{"key of another certificate", kafkaMTLS("KAFKA_TLS_KEY_FILE", f.otherKeyFile), "KAFKA_TLS_KEY_FILE"},
		{"redis key of another certificate", with(minimal(), "REDIS_TLS", "true", "REDIS_TLS_CERT_FILE", f.clientFile,
			"REDIS_TLS_KEY_FILE", f.otherKeyFile), "REDIS_TLS_KEY_FILE"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			setEnv(t, tt.env)
			done := make(chan error, 1)
			go func() { _, err := LoadConfig(); done <- err }()
			var err error
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("LoadConfig still running after 10s")
			}
			if err == nil {
				t.Fatalf("got no error, want one naming %s", tt.wantVar)
			}
			msg := err.Error()
			if want := EnvPrefix + "_" + tt.wantVar + ": "; !strings.HasPrefix(msg, want) {
				t.Errorf("got %q, want it to start with %q", msg, want)
			}
			if strings.ContainsAny(msg, "\r\n") {
				t.Errorf("got %q, want one line", msg)
			}
			if strings.Contains(msg, "hunter2") || strings.Contains(msg, "BEGIN") {
				t.Errorf("got %q, want no file content in the error", msg)
			}
		})
	}
}

// TestTLSFilesOnlyWithValidate checks the clients of a Config that has not
// passed Validate: Kafka's constructors return the file's error, and the
// Redis client trusts no server rather than the system's CAs.
func TestTLSFilesOnlyWithValidate(t *testing.T) {
	f := newTLSTestFiles(t)
	addr := startTLSServer(t, f.serverCert, f.ca)
	cfg := &Config{
		KafkaConfig: KafkaConfig{
			KafkaTLS:       true,
			KafkaTLSCaFile: f.garbageFile,
		},
		RedisConfig: RedisConfig{
			RedisTLS:         true,
			RedisTLSCaFile:   f.garbageFile,
			RedisTLSCertFile: f.clientFile,
			RedisTLSKeyFile:  f.clientKeyFile,
		},
	}
	if _, err := NewKafkaTransport(cfg); err == nil || !strings.HasPrefix(err.Error(), "GATEKEEPER_KAFKA_TLS_CA_FILE: ") {
		t.Errorf("got %v, want an error naming GATEKEEPER_KAFKA_TLS_CA_FILE", err)
	}
	if err := handshake(addr, cfg.redisTLSConfig()); err == nil {
		t.Error("handshake with a Redis CA file that does not load: got success, want an error")
	}
	cfg.RedisTLSCaFile = f.caFile
	if err := handshake(addr, cfg.redisTLSConfig()); err != nil {
		t.Errorf("handshake with the files read without Validate: got %v, want success", err)
	}
}
