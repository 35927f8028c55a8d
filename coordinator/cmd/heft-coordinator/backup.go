package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"heft/coordinator/config"
	"heft/coordinator/store"
	"heft/shared/settings"
	"heft/shared/view"
)

const backupUsage = `usage: heft-coordinator backup [--config FILE] [flags] BACKUP_FILE

Copies the running coordinator's state (pins, decisions, measurements,
node records, audit) to BACKUP_FILE: a consistent copy taken while it
runs, fetched from GET /api/v1/backup on its listen address with its
admin token, both read from the coordinator's own configuration (give the
same --config, flags and HEFT_COORDINATOR_* environment). The file is
written whole or not at all, and checked as the coordinator would check
it at start. To restore: stop the coordinator, copy BACKUP_FILE to
STATE_DIR/heft.db, start it.
`

// backup is `heft-coordinator backup [settings] FILE`.
func backup(ctx context.Context, args []string, env func(string) string, stdout, stderr io.Writer) int {
	if slices.Contains(args, "-h") || slices.Contains(args, "--help") {
		fmt.Fprint(stdout, backupUsage)
		return 0
	}
	if len(args) == 0 || strings.HasPrefix(args[len(args)-1], "-") {
		why := "no FILE to write the backup to"
		if len(args) > 0 {
			why = fmt.Sprintf("the last argument, %q, is a flag: FILE comes last", args[len(args)-1])
		}
		fmt.Fprintf(stderr, "heft-coordinator backup: %s\n\n%s", why, backupUsage)
		return settings.ExitUsage
	}
	file := args[len(args)-1]
	cfg, err := config.Load("", args[:len(args)-1], env)
	if err != nil {
		return settings.Exit("heft-coordinator backup", err, func(w io.Writer) { fmt.Fprint(w, backupUsage) }, stdout, stderr)
	}
	n, err := fetchBackup(ctx, cfg, file)
	if err != nil {
		fmt.Fprintf(stderr, "heft-coordinator backup: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "heft-coordinator backup: wrote %s (%d bytes; checked: the coordinator would start on it)\n", file, n)
	return 0
}

// fetchBackup downloads the state into a temporary file beside file,
// syncs and checks it, and only then renames it to file.
func fetchBackup(ctx context.Context, cfg config.Config, file string) (int64, error) {
	tokens, err := cfg.ReadTokens()
	if err != nil {
		return 0, err
	}
	admin := settings.SplitTokens(tokens.Admin)
	if len(admin) == 0 {
		return 0, errors.New("no admin_token (or admin_token_file) configured: the backup route needs it")
	}
	client, url, err := backupClient(cfg)
	if err != nil {
		return 0, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+admin[0])
	resp, err := client.Do(req)
	if err != nil {
		return 0, fmt.Errorf("is the coordinator running? %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		var e view.Error
		if json.Unmarshal(body, &e) == nil && e.Error != "" {
			return 0, fmt.Errorf("%s: %s", url, e.Error)
		}
		return 0, fmt.Errorf("%s: %s", url, resp.Status)
	}

	tmp, err := os.CreateTemp(filepath.Dir(file), "."+filepath.Base(file)+".part-*")
	if err != nil {
		return 0, err
	}
	keep := false
	defer func() {
		if !keep {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	n, err := io.Copy(tmp, resp.Body)
	if err != nil {
		return n, fmt.Errorf("download cut after %d bytes: %w", n, err)
	}
	if resp.ContentLength >= 0 && n != resp.ContentLength {
		return n, fmt.Errorf("download cut: %d of %d bytes", n, resp.ContentLength)
	}
	if err := tmp.Sync(); err != nil {
		return n, err
	}
	if err := tmp.Close(); err != nil {
		return n, err
	}
	if err := store.Check(tmp.Name()); err != nil {
		return n, fmt.Errorf("the downloaded copy does not check, %s left as it was: %w", file, err)
	}
	if err := os.Rename(tmp.Name(), file); err != nil {
		return n, err
	}
	keep = true
	return n, syncDir(filepath.Dir(file))
}

// syncDir makes a rename in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// backupClient reaches the coordinator at its listen address (loopback
// for a wildcard one). With TLS it trusts exactly the configured
// certificate: the listen address need not be among its names.
func backupClient(cfg config.Config) (*http.Client, string, error) {
	host, port, err := net.SplitHostPort(cfg.Listen)
	if err != nil {
		return nil, "", fmt.Errorf("listen %q: %w", cfg.Listen, err)
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	scheme := "http"
	if cfg.TLS() {
		scheme = "https"
		pemBytes, err := os.ReadFile(cfg.Server.TLSCertFile)
		if err != nil {
			return nil, "", err
		}
		block, _ := pem.Decode(pemBytes)
		if block == nil {
			return nil, "", fmt.Errorf("tls_cert_file %s holds no PEM certificate", cfg.Server.TLSCertFile)
		}
		want := block.Bytes
		tr.TLSClientConfig = &tls.Config{
			// Verified below against the configured certificate itself.
			InsecureSkipVerify: true,
			VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
				if len(raw) == 0 || !bytes.Equal(raw[0], want) {
					return errors.New("the server's certificate is not tls_cert_file's")
				}
				return nil
			},
		}
	}
	return &http.Client{Transport: tr, Timeout: 15 * time.Minute}, scheme + "://" + net.JoinHostPort(host, port) + "/api/v1/backup", nil
}
