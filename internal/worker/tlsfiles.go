package worker

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// maxTLSFile bounds the size of a CA, certificate or key file: a bundle of
// a few hundred CA certificates fits.
const maxTLSFile = 1 << 20

// tlsFiles are the TLS variables of one kind of server, Kafka or Redis:
// <server>_TLS and its CA, certificate and key files.
//
// The CA file replaces the system's CAs: a server's certificate must chain
// to one of its certificates, and nothing else is trusted (as with Kafka's
// ssl.truststore or redis-cli's --cacert). The certificate and key files are
// the client certificate for mutual TLS; both or neither. Setting a file
// while <server>_TLS is false is an error rather than an implied TLS: which
// connections are encrypted stays written in one variable, and a forgotten
// <server>_TLS=true does not pass unnoticed.
//
// The files are read once, by Validate; new certificates take a restart.
type tlsFiles struct {
	server        string // "KAFKA" or "REDIS"
	on            bool
	ca, cert, key string // paths, "" when unset
}

func (c *Config) kafkaTLSFiles() tlsFiles {
	return tlsFiles{server: "KAFKA", on: c.KafkaTLS, ca: c.KafkaTLSCaFile, cert: c.KafkaTLSCertFile, key: c.KafkaTLSKeyFile}
}

func (c *Config) redisTLSFiles() tlsFiles {
	return tlsFiles{server: "REDIS", on: c.RedisTLS, ca: c.RedisTLSCaFile, cert: c.RedisTLSCertFile, key: c.RedisTLSKeyFile}
}

// name is the variable <server>_TLS<suffix>, without the prefix.
func (f tlsFiles) name(suffix string) string { return f.server + "_TLS" + suffix }

// check checks which variables are set, before any file is read.
func (f tlsFiles) check() error {
	if !f.on {
		for _, v := range []struct{ path, suffix string }{{f.ca, "_CA_FILE"}, {f.cert, "_CERT_FILE"}, {f.key, "_KEY_FILE"}} {
			if v.path != "" {
				return bad(f.name(v.suffix), "set, but %s_%s is not true (set it to connect over TLS)", EnvPrefix, f.name(""))
			}
		}
		return nil
	}
	switch {
	case f.cert != "" && f.key == "":
		return bad(f.name("_KEY_FILE"), "required with %s_%s (mutual TLS needs the certificate and its key)", EnvPrefix, f.name("_CERT_FILE"))
	case f.key != "" && f.cert == "":
		return bad(f.name("_CERT_FILE"), "required with %s_%s (mutual TLS needs the certificate and its key)", EnvPrefix, f.name("_KEY_FILE"))
	}
	return nil
}

// load returns the client TLS configuration, or nil when TLS is off. It
// reads and parses the files; errors name the variable and quote nothing
// of a file's content. now is the time the client certificate must be
// valid at.
func (f tlsFiles) load(now time.Time) (*tls.Config, error) {
	if err := f.check(); err != nil || !f.on {
		return nil, err
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if f.ca != "" {
		pool, err := loadCAFile(f.ca)
		if err != nil {
			return nil, bad(f.name("_CA_FILE"), "%v", err)
		}
		cfg.RootCAs = pool
	}
	if f.cert != "" {
		cert, err := f.loadKeyPair(now)
		if err != nil {
			return nil, err
		}
		// Always sent when the server asks, whatever CAs it names as
		// acceptable: a server that refuses it says so in its own log.
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil }
	}
	return cfg, nil
}

// loadCAFile reads a PEM file of CA certificates into a pool of its own.
func loadCAFile(path string) (*x509.CertPool, error) {
	data, err := readTLSFile(path)
	if err != nil {
		return nil, err
	}
	certs, err := parseCertificates(data)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	for _, c := range certs {
		pool.AddCert(c)
	}
	return pool, nil
}

// loadKeyPair reads the client certificate (with its chain) and its key.
func (f tlsFiles) loadKeyPair(now time.Time) (tls.Certificate, error) {
	certVar, keyVar := f.name("_CERT_FILE"), f.name("_KEY_FILE")
	certPEM, err := readTLSFile(f.cert)
	if err != nil {
		return tls.Certificate{}, bad(certVar, "%v", err)
	}
	chain, err := parseCertificates(certPEM)
	if err != nil {
		return tls.Certificate{}, bad(certVar, "%v", err)
	}
	if err := checkClientCert(chain[0], now); err != nil {
		return tls.Certificate{}, bad(certVar, "%v", err)
	}
	keyPEM, err := readTLSFile(f.key)
	if err != nil {
		return tls.Certificate{}, bad(keyVar, "%v", err)
	}
	keyBlock, err := privateKeyBlock(keyPEM)
	if err != nil {
		return tls.Certificate{}, bad(keyVar, "%v", err)
	}
	// Both inputs parse by now: X509KeyPair's remaining errors are fixed
	// texts (a key of another type, or not the certificate's key).
	cert, err := tls.X509KeyPair(certPEM, pem.EncodeToMemory(keyBlock))
	if err != nil {
		return tls.Certificate{}, bad(keyVar, "not the key of the certificate in %s_%s (%v)", EnvPrefix, certVar, err)
	}
	return cert, nil
}

// readTLSFile reads a CA, certificate or key file: a regular file of at
// most maxTLSFile bytes (readBoundedFile).
func readTLSFile(path string) ([]byte, error) { return readBoundedFile(path, maxTLSFile) }

// parseCertificates parses the PEM CERTIFICATE blocks of data, in order;
// there must be at least one and nothing else. Text outside the blocks
// (comments of a bundle) is ignored.
func parseCertificates(data []byte) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	for n := 1; ; n++ {
		var b *pem.Block
		if b, data = pem.Decode(data); b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("PEM block %d is not a CERTIFICATE (a key belongs in its own file)", n)
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			// x509's errors may quote the certificate's content.
			return nil, fmt.Errorf("PEM block %d is not a valid X.509 certificate", n)
		}
		certs = append(certs, c)
	}
	if len(certs) == 0 {
		return nil, errors.New("no PEM CERTIFICATE block found")
	}
	return certs, nil
}

// checkClientCert checks that a client certificate is valid at now and
// meant for client authentication.
func checkClientCert(c *x509.Certificate, now time.Time) error {
	switch {
	case now.After(c.NotAfter):
		return fmt.Errorf("the certificate expired at %s", c.NotAfter.UTC().Format(time.RFC3339))
	case now.Before(c.NotBefore):
		return fmt.Errorf("the certificate is not valid before %s", c.NotBefore.UTC().Format(time.RFC3339))
	case len(c.ExtKeyUsage) > 0 && !slices.Contains(c.ExtKeyUsage, x509.ExtKeyUsageClientAuth) &&
		!slices.Contains(c.ExtKeyUsage, x509.ExtKeyUsageAny):
		return errors.New("the certificate's extended key usage does not include client authentication")
	}
	return nil
}

// privateKeyBlock returns the first PEM private key block of data, parsed
// to make sure it is one: PKCS#8, PKCS#1 (RSA) or SEC 1 (EC), unencrypted.
func privateKeyBlock(data []byte) (*pem.Block, error) {
	for {
		var b *pem.Block
		if b, data = pem.Decode(data); b == nil {
			return nil, errors.New("no PEM PRIVATE KEY block found")
		}
		if !strings.HasSuffix(b.Type, "PRIVATE KEY") {
			continue
		}
		if b.Type == "ENCRYPTED PRIVATE KEY" || strings.Contains(b.Headers["Proc-Type"], "ENCRYPTED") {
			return nil, errors.New("the key is encrypted: give it unencrypted, in a file only this process can read")
		}
		var err error
		switch b.Type {
		case "RSA PRIVATE KEY":
			_, err = x509.ParsePKCS1PrivateKey(b.Bytes)
		case "EC PRIVATE KEY":
			_, err = x509.ParseECPrivateKey(b.Bytes)
		default:
			_, err = x509.ParsePKCS8PrivateKey(b.Bytes)
		}
		if err != nil {
			return nil, errors.New("the PEM private key does not parse (want PKCS#8, PKCS#1 or SEC 1)")
		}
		return b, nil
	}
}

// checkTLS reads and parses the TLS files of Kafka and Redis and keeps the
// configurations for the clients.
func (c *Config) checkTLS() error {
	c.tls = nil
	now := time.Now()
	k, err := c.kafkaTLSFiles().load(now)
	if err != nil {
		return err
	}
	r, err := c.redisTLSFiles().load(now)
	if err != nil {
		return err
	}
	c.tls = &loadedTLS{kafka: k, redis: r}
	return nil
}

// loadedTLS are the client TLS configurations Validate built (nil: no TLS).
type loadedTLS struct {
	kafka, redis *tls.Config
}

// kafkaTLSConfig returns the TLS configuration of Kafka connections (nil:
// plaintext) as Validate read it, or reads the files now on a Config that
// has not passed Validate.
func (c *Config) kafkaTLSConfig() (*tls.Config, error) {
	if c.tls != nil {
		return c.tls.kafka.Clone(), nil
	}
	return c.kafkaTLSFiles().load(time.Now())
}

// redisTLSConfig is kafkaTLSConfig for Redis. It cannot fail: on a Config
// that has not passed Validate and whose files do not load, it returns a
// configuration that trusts no server, so the client fails closed.
func (c *Config) redisTLSConfig() *tls.Config {
	if c.tls != nil {
		return c.tls.redis.Clone()
	}
	cfg, err := c.redisTLSFiles().load(time.Now())
	if err != nil {
		return &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: x509.NewCertPool()}
	}
	return cfg
}
