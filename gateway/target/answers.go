package target

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"heft/gateway/filewrite"
)

// A Resolver's memory dies with heft-sync: restarted during a DNS outage,
// it knows neither the last good address of a name that fails nor where a
// name whose answer moved was put before, so a gateway must leave that old
// server (or endpoint) as it is, since it may carry the unresolved worker.
// An answers file keeps that memory across a restart: each worker DNS
// name's last answer and the one before. It is a file of its own, so that
// no older heft-sync's decoder meets a field it refuses, and it is read
// tolerantly (unknown fields are skipped) for the same reason in reverse.

// maxAnswersFile bounds what is read back: maxRemembered names of at most
// MaxAddress bytes with two IP:ports each are well under it.
const maxAnswersFile = 4 << 20

type answersFile struct {
	Answers []savedAnswer `json:"answers"`
}

type savedAnswer struct {
	Address  string `json:"address"`          // the worker's host:port, a DNS name
	Resolved string `json:"resolved"`         // its last good answer, IP:port
	Before   string `json:"before,omitempty"` // its answer before that one changed
}

// KeepAnswers makes r keep its names' answers in path and reads back what
// path holds, before any lookup. A missing file is nothing known (n 0, no
// error); one that cannot be read or is not well formed is an error, and r
// then starts from nothing, as a heft-sync without the file does, and
// replaces it at its next save.
func (r *Resolver) KeepAnswers(path string) (n int, err error) {
	r.mu.Lock()
	r.file, r.dirty = path, true
	r.mu.Unlock()
	kept, err := readAnswers(path)
	if err != nil || kept == nil {
		return 0, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for name, a := range kept {
		if _, ok := r.last[name]; !ok {
			r.last[name] = a
		}
	}
	r.dirty = false
	return len(kept), nil
}

// ReadAnswers checks the answers file at path: nil for a missing file.
func ReadAnswers(path string) error {
	_, err := readAnswers(path)
	return err
}

func readAnswers(path string) (map[string]remembered, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("answers file: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxAnswersFile+1))
	if err != nil {
		return nil, fmt.Errorf("answers file %s: %w", path, err)
	}
	if len(data) > maxAnswersFile {
		return nil, fmt.Errorf("answers file %s: larger than %d bytes", path, maxAnswersFile)
	}
	out, err := decodeAnswers(data)
	if err != nil {
		return nil, fmt.Errorf("answers file %s: %w", path, err)
	}
	return out, nil
}

// decodeAnswers reads an answers file's content; every entry must be a
// DNS name's well-formed answers, or none is used.
func decodeAnswers(data []byte) (map[string]remembered, error) {
	var af answersFile
	if err := json.Unmarshal(data, &af); err != nil {
		return nil, fmt.Errorf("not a heft-sync answers file: %w", err)
	}
	if len(af.Answers) > maxRemembered {
		return nil, fmt.Errorf("%d names, more than %d", len(af.Answers), maxRemembered)
	}
	out := make(map[string]remembered, len(af.Answers))
	for i, s := range af.Answers {
		name, a, err := s.check()
		if err != nil {
			return nil, fmt.Errorf("entry %d: %w", i+1, err)
		}
		out[name] = a
	}
	return out, nil
}

// check is what a saved answer may be: the answers a DNS name's lookup
// can give (an IP:port at the name's port that a gateway may be given).
func (s savedAnswer) check() (string, remembered, error) {
	if err := CheckAddress(s.Address); err != nil || !isName(s.Address) {
		return "", remembered{}, fmt.Errorf("address %s is not a worker's DNS name and port", Printable(s.Address))
	}
	_, port, _ := net.SplitHostPort(s.Address)
	parse := func(v string) (netip.AddrPort, error) {
		a, err := netip.ParseAddrPort(v)
		if err != nil || strconv.Itoa(int(a.Port())) != port || checkIP(a.Addr()) != nil || a.Addr().Unmap() != a.Addr() {
			return netip.AddrPort{}, fmt.Errorf("answer %s for %s is not an IP at its port", Printable(v), s.Address)
		}
		return a, nil
	}
	var a remembered
	var err error
	if a.addr, err = parse(s.Resolved); err != nil {
		return "", remembered{}, err
	}
	if s.Before != "" {
		if a.prev, err = parse(s.Before); err != nil {
			return "", remembered{}, err
		}
	}
	return s.Address, a, nil
}

// isName reports whether addr's host is a DNS name, not an IP literal,
// whose answer never changes and so is not kept.
func isName(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	_, err = netip.ParseAddr(host)
	return err != nil
}

// encodeAnswers renders what r remembers of DNS names, sorted, so that an
// unchanged memory is unchanged bytes. r.mu is held.
func (r *Resolver) encodeAnswers() ([]byte, error) {
	af := answersFile{Answers: []savedAnswer{}}
	for name, a := range r.last {
		if !isName(name) {
			continue
		}
		s := savedAnswer{Address: name, Resolved: a.addr.String()}
		if a.prev.IsValid() {
			s.Before = a.prev.String()
		}
		af.Answers = append(af.Answers, s)
	}
	slices.SortFunc(af.Answers, func(a, b savedAnswer) int { return strings.Compare(a.Address, b.Address) })
	data, err := json.MarshalIndent(af, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(data, '\n'), nil
}

// saveAnswers writes the answers file when what r remembers changed since
// it was last written or read.
func (r *Resolver) saveAnswers() error {
	r.saveMu.Lock()
	defer r.saveMu.Unlock()
	r.mu.Lock()
	if r.file == "" || !r.dirty {
		r.mu.Unlock()
		return nil
	}
	data, err := r.encodeAnswers()
	r.dirty = false
	path := r.file
	r.mu.Unlock()
	if err == nil && !bytes.Equal(data, r.saved) {
		if err = filewrite.Atomic(path, data, 0o640); err == nil {
			r.saved = data
		}
	}
	if err != nil {
		r.mu.Lock()
		r.dirty = true // try again at the next apply
		r.mu.Unlock()
		return Fail(ReasonWrite, fmt.Errorf("could not keep the DNS answers (a heft-sync restarted during a DNS outage would not know them): %w", err))
	}
	return nil
}

// CheckStateFile is heft-sync --check's look at a table's answers file
// (path; "" is none): what is there reads, and its folder takes a new file.
func CheckStateFile(path string) error {
	if path == "" {
		return nil
	}
	if err := ReadAnswers(path); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".check-*")
	if err != nil {
		return fmt.Errorf("state file %s cannot be written: %w", path, err)
	}
	f.Close()
	return os.Remove(f.Name())
}
