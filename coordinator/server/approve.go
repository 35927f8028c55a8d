package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"path"
	"strings"

	"heft/coordinator/audit"
	"heft/coordinator/nodes"
	"heft/shared/view"
)

// POST /api/v1/nodes/approve approves every pending node a selector
// names, in one call: {"name": "gpu-*"} (a shell pattern, as path.Match
// reads it), {"address": "10.0.0.0/24"} (the address its agent connected
// from, in a prefix, or one address), both (a node must match both), or
// {"all": true} (every pending node). Each approval is an audit entry.

// approveBody is the selector of a bulk approval.
type approveBody struct {
	Name    string `json:"name"`
	Address string `json:"address"`
	All     bool   `json:"all"`
}

// approveAnswer is the answer of a bulk approval: the nodes approved, and
// those the selector matched that could not be (changed meanwhile).
type approveAnswer struct {
	Approved []view.Node    `json:"approved"`
	Failed   []approveError `json:"failed,omitempty"`
}

type approveError struct {
	Node  string `json:"node"`
	Error string `json:"error"`
}

// nodeSelector is a parsed approveBody.
type nodeSelector struct {
	name   string
	prefix netip.Prefix
	all    bool
}

func (sel nodeSelector) String() string {
	var parts []string
	if sel.all {
		parts = append(parts, "all pending")
	}
	if sel.name != "" {
		parts = append(parts, "name "+sel.name)
	}
	if sel.prefix.IsValid() {
		parts = append(parts, "address "+sel.prefix.String())
	}
	return "bulk approve: " + strings.Join(parts, ", ")
}

func (sel nodeSelector) match(rec nodes.Record) bool {
	if rec.State != nodes.StatePending {
		return false
	}
	if sel.name != "" {
		if ok, _ := path.Match(sel.name, rec.Name); !ok {
			return false
		}
	}
	if sel.prefix.IsValid() {
		a, err := netip.ParseAddr(rec.Address)
		if err != nil {
			ap, err2 := netip.ParseAddrPort(rec.Address)
			if err2 != nil {
				return false
			}
			a = ap.Addr()
		}
		if !sel.prefix.Contains(a.Unmap()) {
			return false
		}
	}
	return true
}

// parseSelector reads a bulk approval's body; an error is the 400 to answer.
func parseSelector(body io.Reader) (nodeSelector, int, error) {
	const want = `body must be {"name": "<pattern>"}, {"address": "<prefix or address>"}, both, or {"all": true}`
	data, err := io.ReadAll(body)
	if err != nil {
		if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
			return nodeSelector{}, http.StatusRequestEntityTooLarge, fmt.Errorf("request body over %d bytes", mbe.Limit)
		}
		return nodeSelector{}, http.StatusBadRequest, fmt.Errorf("read body: %v", err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var b approveBody
	if err := dec.Decode(&b); err != nil {
		return nodeSelector{}, http.StatusBadRequest, fmt.Errorf("%s: %v", want, err)
	}
	if err := dec.Decode(new(json.RawMessage)); err != io.EOF {
		return nodeSelector{}, http.StatusBadRequest, errors.New(want + ": trailing data after the object")
	}
	sel := nodeSelector{name: b.Name, all: b.All}
	switch {
	case b.All && (b.Name != "" || b.Address != ""):
		return nodeSelector{}, http.StatusBadRequest, errors.New(`"all" approves every pending node: give it alone, or name and address without it`)
	case !b.All && b.Name == "" && b.Address == "":
		return nodeSelector{}, http.StatusBadRequest, errors.New(want)
	}
	if b.Name != "" {
		if _, err := path.Match(b.Name, ""); err != nil {
			return nodeSelector{}, http.StatusBadRequest, fmt.Errorf("name pattern %q: %v", b.Name, err)
		}
	}
	if b.Address != "" {
		p, err := netip.ParsePrefix(b.Address)
		if err != nil {
			a, err2 := netip.ParseAddr(b.Address)
			if err2 != nil {
				return nodeSelector{}, http.StatusBadRequest, fmt.Errorf("address %q is neither a prefix (10.0.0.0/24) nor an address", b.Address)
			}
			p = netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen())
		}
		sel.prefix = p.Masked()
	}
	return sel, 0, nil
}

// approveNodes is POST /api/v1/nodes/approve.
func (s *Server) approveNodes(w http.ResponseWriter, r *http.Request) {
	if len(r.URL.Query()) > 0 {
		writeError(w, http.StatusBadRequest, "POST /api/v1/nodes/approve takes no parameters: the selector goes in the body")
		return
	}
	sel, status, err := parseSelector(r.Body)
	if err != nil {
		writeError(w, status, err.Error())
		return
	}
	out := approveAnswer{Approved: []view.Node{}}
	for _, rec := range s.opts.Nodes.List() {
		if !sel.match(rec) {
			continue
		}
		after, err := s.opts.Nodes.Approve(rec.Name)
		if err != nil {
			out.Failed = append(out.Failed, approveError{Node: rec.Name, Error: err.Error()})
			continue
		}
		s.record(r, audit.Entry{Action: "approve", Target: rec.Name, Old: rec.State, New: after.State, Detail: sel.String()})
		out.Approved = append(out.Approved, s.nodeView(after))
	}
	writeJSON(w, http.StatusOK, out)
}
