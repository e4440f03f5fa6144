package integration

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fkmat/fkmat/internal/testenv"
)

// testCA is a certificate authority made for one test.
type testCA struct {
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	certPEM []byte
}

// newCA returns a fresh self-signed CA valid for an hour.
func newCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, key: key, certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// serverCert issues a server certificate for the given IP addresses and
// returns it and its key, PEM-encoded.
func (ca *testCA) serverCert(t *testing.T, ips ...net.IP) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "fkmat test server"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IPAddresses: ips,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	k, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: k})
}

// TestSecurityRedisTLS: fkmat keeps a join over a Redis that speaks only
// TLS (rediss://, with a requirepass password), trusting a private CA named
// by SSL_CERT_FILE, and its state is in that Redis. With another CA, or
// with a host name the certificate does not hold, check and run exit 2
// naming the certificate, without the password in the output.
func TestSecurityRedisTLS(t *testing.T) {
	tc := testenv.New(t)
	ctx := context.Background()
	const password = "Redis-TLS-Pw-5521"
	ca := newCA(t, "fkmat test CA")
	cert, key := ca.serverCert(t, net.IPv4(127, 0, 0, 1))
	addr := tc.Env.ExtraRedis(t, map[string][]byte{"/tls/server.pem": cert, "/tls/server.key": key},
		"--port", "0", "--tls-port", "6379", "--tls-cert-file", "/tls/server.pem", "--tls-key-file", "/tls/server.key",
		"--tls-auth-clients", "no", "--requirepass", password, "--appendonly", "yes")
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	caFile := writeFile(t, "redis-ca.pem", string(ca.certPEM))
	sqlExec(t, tc, shop, `INSERT INTO customers VALUES (1, 'ann', 'gold'), (2, 'bob', NULL)`,
		`INSERT INTO orders SELECT g, 1 + g % 3, g, 'n' FROM generate_series(1, 30) g`)
	env := withEnv(withEnv(cliEnv(t, tc, leftJoinYAML), "FKMAT_REDIS_URL", "rediss://:"+password+"@"+addr+"/0"),
		"SSL_CERT_FILE", caFile)

	bad := map[string][]string{
		"another CA": withEnv(env, "SSL_CERT_FILE", writeFile(t, "other.pem", string(newCA(t, "other CA").certPEM))),
		"a host name the certificate lacks": withEnv(env, "FKMAT_REDIS_URL",
			"rediss://:"+password+"@"+net.JoinHostPort("localhost", port)+"/0"),
	}
	for name, env := range bad {
		for _, cmd := range []string{"check", "run"} {
			r := runCLI(t, env, cmd)
			if r.code != 2 || !strings.Contains(r.stderr, "certificate") || strings.Contains(r.stdout+r.stderr, password) {
				t.Fatalf("%s with %s: exit %d, want 2 naming the certificate without the password\n%s%s",
					cmd, name, r.code, r.stdout, r.stderr)
			}
		}
	}

	if r := runCLI(t, env, "check"); r.code != 0 {
		t.Fatalf("check over TLS: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	d := startRunCLI(t, env)
	waitCaughtUp(t, tc, d.daemon)
	sqlExec(t, tc, `UPDATE customers SET name = 'ANN' WHERE id = 1`, `UPDATE orders SET customer_id = 2 WHERE id < 5`,
		`INSERT INTO orders VALUES (31, 3, 1, 'x')`, `INSERT INTO customers VALUES (3, 'cy', 'silver')`,
		`DELETE FROM orders WHERE id = 10`)
	waitCaughtUp(t, tc, d.daemon)
	if err := d.term(t); err != nil {
		t.Fatalf("run over TLS: %v\n%s", err, d.stderr.String())
	}

	// The state is in the TLS Redis, and only there.
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	rdb := redis.NewClient(&redis.Options{Addr: addr, Password: password,
		TLSConfig: &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool, ServerName: "127.0.0.1"}})
	defer func() { _ = rdb.Close() }()
	keys, _, err := rdb.Scan(ctx, 0, "fkmat:"+tc.Slot+":*", 10000).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) == 0 {
		t.Fatal("no fkmat key in the TLS Redis")
	}
	it := tc.Redis.Scan(ctx, 0, "fkmat:"+tc.Slot+":*", 1000).Iterator()
	if it.Next(ctx) || it.Err() != nil {
		t.Fatalf("fkmat key %q in the shared plain Redis (%v)", it.Val(), it.Err())
	}
	if r := runCLI(t, env, "verify"); r.code != 0 {
		t.Fatalf("verify over TLS: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}
