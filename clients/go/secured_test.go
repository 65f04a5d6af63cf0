package permit_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"permit.dev/go/permit"
)

// pki writes a private CA (ca.pem), a server certificate for 127.0.0.1 (server.pem,
// server.key) and a client certificate (client.pem, client.key) into dir.
func pki(t *testing.T, dir string) {
	t.Helper()
	write := func(name, kind string, der []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	key := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	now := time.Now()
	caKey := key()
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "permit-go-test-ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	write("ca.pem", "CERTIFICATE", caDER)
	for i, who := range []string{"server", "client"} {
		k := key()
		leaf := &x509.Certificate{
			SerialNumber: big.NewInt(int64(i + 2)), Subject: pkix.Name{CommonName: who},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		}
		if who == "server" {
			leaf.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
			leaf.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
		}
		der, err := x509.CreateCertificate(rand.Reader, leaf, ca, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		write(who+".pem", "CERTIFICATE", der)
		keyDER, err := x509.MarshalPKCS8PrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		write(who+".key", "PRIVATE KEY", keyDER)
	}
}

// A private CA (WithCAFile) and a client certificate (WithClientCert) against a server that
// requires one; without either the handshake fails, with code tls, and is not retried.
func TestTLSWithAPrivateCAAndAClientCertificate(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	pki(t, dir)
	at := func(name string) string { return filepath.Join(dir, name) }
	node := newServer(t, "--tls-cert", at("server.pem"), "--tls-key", at("server.key"), "--tls-client-ca", at("ca.pem"))
	if !strings.HasPrefix(node.URL, "https://") {
		t.Fatalf("not served over TLS: %s", node.URL)
	}
	ctx := bounded(t, 20*time.Second)
	c := newClient(t, []string{node.URL}, permit.WithCAFile(at("ca.pem")), permit.WithClientCert(at("client.pem"), at("client.key")))
	s := newSession(t, ctx, c, permit.SessionTTL(time.Second))
	name := newName(t)
	h, err := s.Acquire(ctx, name, permit.Capacity(1))
	if err != nil {
		t.Fatal(err)
	}
	// Keepalives go over TLS too: the session outlives its TTL.
	start := time.Now()
	if !eventually(5*time.Second, func() bool { return s.Deadline().After(start.Add(2 * time.Second)) }) || isClosed(h.Lost()) {
		t.Fatal("the session was not kept alive over TLS")
	}
	if ok, err := c.Validate(ctx, name, h.Token()); err != nil || !ok {
		t.Fatalf("validate: %v %v", ok, err)
	}
	for what, opts := range map[string][]permit.Option{
		"no client certificate": {permit.WithCAFile(at("ca.pem"))},
		"no CA":                 {permit.WithClientCert(at("client.pem"), at("client.key"))},
	} {
		refused := newClient(t, []string{node.URL}, append(opts, permit.WithTimeout(2*time.Second))...)
		started := time.Now()
		_, err := refused.Semaphore(ctx, name)
		var e *permit.Error
		if !errors.As(err, &e) || (e.Code != "tls" && e.Code != "connection") {
			t.Fatalf("%s: %#v", what, err)
		}
		// Retried, it would go on for the 6 s retry window.
		if what == "no CA" && (e.Code != "tls" || time.Since(started) > 3*time.Second) {
			t.Fatalf("an untrusted server certificate is code tls, not retried: %v after %v", e, time.Since(started))
		}
	}
}

// With --auth: no token is ErrUnauthenticated; the root token works; a token that may only
// read semaphores is ErrPermissionDenied when it creates a session.
func TestAuthTokens(t *testing.T) {
	t.Parallel()
	node := newServer(t, "--auth")
	var root string
	if !eventually(10*time.Second, func() bool {
		data, err := os.ReadFile(filepath.Join(node.Dir, "root-token"))
		root = strings.TrimSpace(string(data))
		return err == nil && root != ""
	}) {
		t.Fatal("no root token written")
	}
	// The server writes the secret before the token's creation is committed.
	if !eventually(10*time.Second, func() bool {
		status, _, err := raw("GET", node.URL+"/v1/sessions", root, nil)
		return err == nil && status == 200
	}) {
		t.Fatal("the root token is not accepted")
	}
	ctx := bounded(t, 20*time.Second)
	name := newName(t)
	anonymous := newClient(t, []string{node.URL}, permit.WithAuthToken(""))
	_, err := anonymous.NewSession(ctx)
	var e *permit.Error
	if !errors.Is(err, permit.ErrUnauthenticated) || !errors.As(err, &e) || e.Status != 401 {
		t.Fatalf("without a token: %v", err)
	}
	c := newClient(t, []string{node.URL}, permit.WithAuthToken(root))
	s := newSession(t, ctx, c)
	h, err := s.Acquire(ctx, name, permit.Capacity(1))
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := c.Validate(ctx, name, h.Token()); err != nil || !ok {
		t.Fatalf("validate: %v %v", ok, err)
	}
	status, body, err := raw("POST", node.URL+"/v1/acl/tokens", root, map[string]any{
		"name":  "reader",
		"rules": []map[string]string{{"resource": "semaphore", "prefix": "", "access": "read"}},
	})
	if err != nil || status != 201 {
		t.Fatalf("token: %d %s %v", status, body, err)
	}
	var created struct {
		Secret string `json:"secret"`
	}
	if err := json.Unmarshal(body, &created); err != nil {
		t.Fatal(err)
	}
	reader := newClient(t, []string{node.URL}, permit.WithAuthToken(created.Secret))
	if info, err := reader.Semaphore(ctx, name); err != nil || len(info.Holders) != 1 {
		t.Fatalf("a reader reads: %+v %v", info, err)
	}
	if _, err := reader.NewSession(ctx); !errors.Is(err, permit.ErrPermissionDenied) {
		t.Fatalf("a reader made a session: %v", err)
	}
	if _, err := reader.SetCapacity(ctx, name, 3); !errors.Is(err, permit.ErrPermissionDenied) {
		t.Fatalf("a reader wrote: %v", err)
	}
}
