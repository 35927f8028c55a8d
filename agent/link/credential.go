package link

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
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

const (
	// maxCredentialFile bounds what is read of the file: a corrupt or
	// hostile one is refused without reading it whole. 17 entries at
	// their largest (253-byte names, 128-byte credentials, escaped) fit.
	maxCredentialFile = 64 << 10
	// maxOtherNodes bounds the credentials of other node names kept.
	maxOtherNodes = 16
)

// credentialFile keeps the credential in a file readable by its owner
// only (0600), replaced atomically, with the node name it belongs to: a
// credential kept for another name is not presented, but kept, so that
// fixing a mistyped node.name finds the real name's credential again.
type credentialFile struct {
	path, node string
}

// credentialDoc is the file. Node and Credential are this node's, as
// agents before Others wrote it (and still read it); Others keeps other
// names' credentials, newest first.
type credentialDoc struct {
	Node       string           `json:"node"`
	Credential string           `json:"credential"`
	Others     []nodeCredential `json:"others,omitempty"`
}

type nodeCredential struct {
	Node       string `json:"node"`
	Credential string `json:"credential"`
}

// credentialOf returns node's credential in the document, "" if none.
func (d *credentialDoc) credentialOf(node string) string {
	if d.Node == node {
		return d.Credential
	}
	for _, o := range d.Others {
		if o.Node == node {
			return o.Credential
		}
	}
	return ""
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
	doc, err := f.read()
	if err != nil {
		return "", err
	}
	return doc.credentialOf(f.node), nil
}

// otherNodes returns the other node names whose credentials the file keeps.
func (f *credentialFile) otherNodes() []string {
	doc, err := f.read()
	if err != nil {
		return nil
	}
	var names []string
	if doc.Node != "" && doc.Node != f.node && doc.Credential != "" {
		names = append(names, doc.Node)
	}
	for _, o := range doc.Others {
		if o.Node != f.node {
			names = append(names, o.Node)
		}
	}
	return names
}

// read returns the file's document, a zero one when there is no file. It
// opens without following a symlink and without blocking on a FIFO, then
// checks the open file, so what it checked is what it reads.
func (f *credentialFile) read() (credentialDoc, error) {
	var doc credentialDoc
	file, err := os.OpenFile(f.path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return doc, nil
	}
	if errors.Is(err, syscall.ELOOP) {
		return doc, fmt.Errorf("node credential file %s is a symbolic link; the agent keeps a regular file there: move it aside", f.path)
	}
	if err != nil {
		return doc, fmt.Errorf("node credential: %w", err)
	}
	defer file.Close()
	info, err := file.Stat()
	if err != nil {
		return doc, fmt.Errorf("node credential: %w", err)
	}
	if !info.Mode().IsRegular() {
		return doc, fmt.Errorf("node credential file %s is not a regular file (%v); move it aside", f.path, info.Mode().Type())
	}
	if info.Mode().Perm()&0o077 != 0 {
		return doc, fmt.Errorf("node credential file %s has mode %04o: others may read it; chmod 600 it", f.path, info.Mode().Perm())
	}
	data, err := io.ReadAll(io.LimitReader(file, maxCredentialFile+1))
	if err != nil {
		return doc, fmt.Errorf("node credential: %w", err)
	}
	if len(data) > maxCredentialFile {
		err = fmt.Errorf("larger than %d bytes", maxCredentialFile)
	} else {
		err = json.Unmarshal(data, &doc)
	}
	if err != nil {
		return doc, fmt.Errorf("node credential file %s is not what this agent writes (%v); move it aside, and have an admin release the node name", f.path, err)
	}
	return doc, nil
}

// Save writes a temporary file, syncs it and renames it over the old one,
// so a crash leaves the old credential or the new one, never half of one.
// Other names' credentials are carried over (the oldest beyond
// maxOtherNodes dropped), never replaced by this one's.
func (f *credentialFile) Save(cred string) error {
	old, err := f.read()
	if err != nil {
		return fmt.Errorf("keep the node credential: %w", err)
	}
	doc := credentialDoc{Node: f.node, Credential: cred}
	kept := append([]nodeCredential{{Node: old.Node, Credential: old.Credential}}, old.Others...)
	for _, o := range kept {
		if o.Node != "" && o.Node != f.node && o.Credential != "" && len(doc.Others) < maxOtherNodes &&
			!slices.ContainsFunc(doc.Others, func(d nodeCredential) bool { return d.Node == o.Node }) {
			doc.Others = append(doc.Others, o)
		}
	}
	data, err := json.Marshal(doc)
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
