package link

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
)

// Credentials keeps the node credential the coordinator hands this agent
// when its node name enrols; every later hello presents it, and a
// connection for the name without it is refused. Losing it locks the node
// out until an admin releases the name.
type Credentials interface {
	// Load returns the credential kept for this node, "" when there is none.
	Load() (string, error)
	// Save keeps a new credential, durably, before it is used.
	Save(credential string) error
}

// memCredentials keeps the credential for this process only.
type memCredentials struct {
	mu   sync.Mutex
	cred string
}

func (m *memCredentials) Load() (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cred, nil
}

func (m *memCredentials) Save(c string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cred = c
	return nil
}

// CredentialFileName is the credential's file in the agent's state_dir.
const CredentialFileName = "node.credential"

// credentialFile keeps the credential in a file readable by its owner
// only (0600), replaced atomically, with the node name it belongs to: a
// credential kept for another name is not presented.
type credentialFile struct {
	path, node string
}

type credentialDoc struct {
	Node       string `json:"node"`
	Credential string `json:"credential"`
}

// CredentialFile keeps node's credential in dir/node.credential. It
// creates dir (0700) if needed and checks, now rather than at the first
// enrolment, that the agent can write there.
func CredentialFile(dir, node string) (Credentials, error) {
	if dir == "" {
		return nil, errors.New("state_dir is empty: the agent keeps its node credential there")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("state_dir: %w (set state_dir to a directory this user can write; the packaged unit has StateDirectory=heft-agent)", err)
	}
	probe, err := os.CreateTemp(dir, ".write-check-*")
	if err != nil {
		return nil, fmt.Errorf("state_dir %s is not writable: %w (the agent keeps its node credential there)", dir, err)
	}
	probe.Close()
	_ = os.Remove(probe.Name())
	f := &credentialFile{path: filepath.Join(dir, CredentialFileName), node: node}
	if _, err := f.Load(); err != nil {
		return nil, err
	}
	return f, nil
}

func (f *credentialFile) Load() (string, error) {
	info, err := os.Stat(f.path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("node credential: %w", err)
	}
	if info.Mode().Perm()&0o077 != 0 {
		return "", fmt.Errorf("node credential file %s has mode %04o: others may read it; chmod 600 it", f.path, info.Mode().Perm())
	}
	data, err := os.ReadFile(f.path)
	if err != nil {
		return "", fmt.Errorf("node credential: %w", err)
	}
	var doc credentialDoc
	if err := json.Unmarshal(data, &doc); err != nil {
		return "", fmt.Errorf("node credential file %s is not what this agent writes (%v); move it aside, and have an admin release the node name", f.path, err)
	}
	if doc.Node != f.node {
		return "", nil // kept for another node name; this one enrols anew
	}
	return doc.Credential, nil
}

// Save writes a temporary file, syncs it and renames it over the old one,
// so a crash leaves the old credential or the new one, never half of one.
func (f *credentialFile) Save(cred string) error {
	data, err := json.Marshal(credentialDoc{Node: f.node, Credential: cred})
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(f.path), ".node.credential-*")
	if err != nil {
		return fmt.Errorf("keep the node credential: %w", err)
	}
	defer os.Remove(tmp.Name()) // after a successful rename there is nothing to remove
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return fmt.Errorf("keep the node credential: %w", err)
	}
	if _, err := tmp.Write(append(data, '\n')); err != nil {
		tmp.Close()
		return fmt.Errorf("keep the node credential: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("keep the node credential: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("keep the node credential: %w", err)
	}
	if err := os.Rename(tmp.Name(), f.path); err != nil {
		return fmt.Errorf("keep the node credential: %w", err)
	}
	if d, err := os.Open(filepath.Dir(f.path)); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}
