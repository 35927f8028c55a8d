package e2e

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"heft/coordinator/config"
	"heft/shared/testutil"
	"heft/sim"
)

// writeCA makes a private CA and a server certificate for 127.0.0.1 signed
// by it, and returns the PEM paths.
func writeCA(t *testing.T, dir, name string) (caFile, certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name + " CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	caFile, certFile, keyFile = filepath.Join(dir, name+"-ca.pem"), filepath.Join(dir, name+"-cert.pem"), filepath.Join(dir, name+"-key.pem")
	for path, block := range map[string]*pem.Block{caFile: {Type: "CERTIFICATE", Bytes: caDER},
		certFile: {Type: "CERTIFICATE", Bytes: der}, keyFile: {Type: "EC PRIVATE KEY", Bytes: keyDER}} {
		if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	pool = x509.NewCertPool()
	pool.AddCert(ca)
	return caFile, certFile, keyFile, pool
}

// TestTLS runs the agent link over wss:// to a coordinator whose
// certificate a private CA signed: an agent that trusts the CA is admitted,
// one that trusts another CA never gets in.
func TestTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	caFile, certFile, keyFile, pool := writeCA(t, dir, "heft")
	otherCA, _, _, _ := writeCA(t, dir, "other")
	c := startCoordinatorWith(t, filepath.Join(dir, "state"), "127.0.0.1:0", func(cfg *config.Config) {
		cfg.Server.TLSCertFile, cfg.Server.TLSKeyFile = certFile, keyFile
	})
	c.scheme = "https"
	c.client = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}

	goodLog, badLog := filepath.Join(dir, "good.log"), filepath.Join(dir, "bad.log")
	good := startSim(t, sim.Config{Flavor: "vllm", Model: model, SingleTPS: 200, Batch16TPS: 1600, LogPath: goodLog}, "127.0.0.1:0")
	bad := startSim(t, sim.Config{Flavor: "vllm", Model: model, SingleTPS: 200, Batch16TPS: 1600, LogPath: badLog}, "127.0.0.1:0")
	wss := "wss://" + c.addr + "/api/v1/agent"
	startAgentWith(t, wss, "ca_file = \""+caFile+"\"", "tls-good", "vllm", good.URL(), goodLog)
	badAgent := startAgentWith(t, wss, "ca_file = \""+otherCA+"\"", "tls-bad", "vllm", bad.URL(), badLog)

	c.waitFor(t, "the agent that trusts the CA admitted", 60*time.Second, settled("tls-good"))
	if _, ok := byNode(c.workers(t), "tls-bad"); ok {
		t.Error("an agent that does not trust the coordinator's certificate got in")
	}
	testutil.Eventually(t, "the untrusting agent's log to say why it cannot connect", 10*time.Second, func() bool {
		return strings.Contains(badAgent.out.String(), "certificate")
	})
	// Plain HTTP to the TLS port is refused, not served.
	if resp, err := http.Get("http://" + c.addr + "/api/v1/workers"); err == nil {
		if resp.StatusCode == http.StatusOK {
			t.Error("the TLS coordinator answered plain HTTP with data")
		}
		resp.Body.Close()
	}
}
