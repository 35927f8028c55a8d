package envoy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"

	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"

	"heft/gateway/filewrite"
	"heft/gateway/target"
)

// Envoy keeps the last assignment it accepted while its xDS server is
// away, but a restarted heft-sync holds nothing of what it sent. The state
// file is that memory: what heft-sync last published for one cluster, so
// that its first apply after a restart starts from what Envoy routes by
// (syncer.Reader) rather than taking out every worker the coordinator
// lists as measuring.

// maxStateFile bounds what is read back: a cluster of a few thousand
// endpoints is well under it.
const maxStateFile = 4 << 20

// savedState is the state file's content.
type savedState struct {
	Cluster   string          `json:"cluster"`
	Model     string          `json:"model"`
	Endpoints []savedEndpoint `json:"endpoints"`
}

type savedEndpoint struct {
	Address string `json:"address"` // IP:port, as published
	Weight  uint32 `json:"weight"`  // load_balancing_weight, 1–MaxWeight
}

// encodeState renders what cla publishes.
func encodeState(model string, cla *endpointv3.ClusterLoadAssignment) ([]byte, error) {
	st := savedState{Cluster: cla.GetClusterName(), Model: model, Endpoints: []savedEndpoint{}}
	for _, l := range cla.GetEndpoints() {
		for _, e := range l.GetLbEndpoints() {
			a, err := endpointAddr(e)
			if err != nil {
				return nil, err
			}
			st.Endpoints = append(st.Endpoints, savedEndpoint{
				Address: a.String(),
				Weight:  e.GetLoadBalancingWeight().GetValue(),
			})
		}
	}
	data, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(data, '\n'), nil
}

// decodeState reads a state file's content; it must be the cluster's own
// and every endpoint well formed, or none of it is used.
func decodeState(data []byte, cluster string) ([]target.Served, error) {
	var st savedState
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&st); err != nil {
		return nil, fmt.Errorf("not a heft-sync Envoy state: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("not a heft-sync Envoy state: text after the JSON object")
	}
	if st.Cluster != cluster {
		return nil, fmt.Errorf("it holds cluster %q, not %q (two tables given one state_file?)", st.Cluster, cluster)
	}
	out := make([]target.Served, 0, len(st.Endpoints))
	for i, e := range st.Endpoints {
		a, err := netip.ParseAddrPort(e.Address)
		if err != nil || a.Port() == 0 {
			return nil, fmt.Errorf("endpoint %d: address %q is not IP:port", i+1, e.Address)
		}
		if e.Weight < 1 || e.Weight > MaxWeight {
			return nil, fmt.Errorf("endpoint %d (%s): weight %d is outside 1–%d", i+1, e.Address, e.Weight, MaxWeight)
		}
		out = append(out, target.Served{Address: a.String(), Weight: float64(e.Weight), Owned: true})
	}
	return out, nil
}

// Served implements syncer.Reader: the endpoints heft-sync last published
// for this cluster, from its state file. Without a state file, or before
// the first publish, there is nothing to say.
func (c *Cluster) Served(context.Context) ([]target.Served, error) {
	if c.stateFile == "" {
		return nil, nil
	}
	f, err := os.Open(c.stateFile)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("state file: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxStateFile+1))
	if err != nil {
		return nil, fmt.Errorf("state file %s: %w", c.stateFile, err)
	}
	if len(data) > maxStateFile {
		return nil, fmt.Errorf("state file %s: larger than %d bytes", c.stateFile, maxStateFile)
	}
	out, err := decodeState(data, c.name)
	if err != nil {
		return nil, fmt.Errorf("state file %s: %w", c.stateFile, err)
	}
	return out, nil
}

// restore publishes what the state file holds, before any apply. A file
// that cannot be read publishes nothing: the first apply decides. A
// Detached server publishes nothing.
func (c *Cluster) restore() {
	if c.s.ln == nil {
		return
	}
	served, err := c.Served(context.Background())
	if err != nil {
		c.s.log.Warn("the state file cannot be read; the cluster waits for its first apply", "cluster", c.name, "error", err)
		return
	}
	if served == nil {
		return
	}
	eps := make([]*endpointv3.LbEndpoint, 0, len(served))
	for _, e := range served {
		eps = append(eps, endpoint(netip.MustParseAddrPort(e.Address), uint32(e.Weight)))
	}
	if _, version, err := c.s.set(c.name, assignment(c.name, eps)); err != nil {
		c.s.log.Warn("could not publish the state file's assignment", "cluster", c.name, "error", err)
	} else {
		c.s.log.Info("published what heft-sync last published before it restarted", "cluster", c.name,
			"endpoints", len(eps), "version", version, "state_file", c.stateFile)
	}
}

// save keeps what was just published in the state file, when it changed
// since the last save.
func (c *Cluster) save(cla *endpointv3.ClusterLoadAssignment) error {
	if c.stateFile == "" {
		return nil
	}
	data, err := encodeState(c.model, cla)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if bytes.Equal(data, c.saved) {
		return nil
	}
	if err := filewrite.Atomic(c.stateFile, data, 0o640); err != nil {
		return err
	}
	c.saved = data
	return nil
}

// Check implements syncer.Checker: a state file that is there reads as
// this cluster's, and its folder takes a new file.
func (c *Cluster) Check(ctx context.Context) error {
	if c.stateFile == "" {
		return nil
	}
	if _, err := c.Served(ctx); err != nil {
		return err
	}
	if err := target.ReadAnswers(AnswersFile(c.stateFile)); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(c.stateFile), "."+filepath.Base(c.stateFile)+".check-*")
	if err != nil {
		return fmt.Errorf("state file %s cannot be written: %w", c.stateFile, err)
	}
	f.Close()
	return os.Remove(f.Name())
}
