package server

import (
	"fmt"

	"github.com/hashicorp/go-hclog"

	"heft/shared/grammar"
	"heft/shared/wire"
)

// checkGrammar refuses a message carrying a string that could reach a
// gateway's configuration (a capacity key, a model name, an engine URL)
// or name a node outside shared/grammar. wire.Decode has checked the
// message's shape; this is the coordinator's own wall, applied on receipt
// so that nothing of a refused message is stored.
func checkGrammar(env *wire.Envelope) error {
	switch env.Type {
	case wire.TypeHello:
		if err := grammar.NodeName(env.Hello.Node); err != nil {
			return fmt.Errorf("hello: %w", err)
		}
	case wire.TypeSnapshot: // its node is the hello's (hub.dispatch)
		for i, e := range env.Snapshot.Engines {
			if err := checkEngine(e); err != nil {
				return fmt.Errorf("snapshot engine %d: %w", i, err)
			}
		}
	case wire.TypeProbeResult:
		return checkMeasurement(&env.ProbeResult.Measurement)
	case wire.TypeProbeStatus:
		if err := grammar.CapacityKey(env.ProbeStatus.CapacityKey); err != nil {
			return fmt.Errorf("probe_status: %w", err)
		}
	}
	return nil
}

func checkEngine(e wire.Engine) error {
	if e.CapacityKey != "" {
		if err := grammar.CapacityKey(e.CapacityKey); err != nil {
			return err
		}
	}
	if e.Model != "" {
		if err := grammar.Model(e.Model); err != nil {
			return err
		}
	}
	if _, err := grammar.URL(e.URL); err != nil {
		return fmt.Errorf("engine url: %w", err)
	}
	if e.AdvertiseURL != "" {
		if _, err := grammar.URL(e.AdvertiseURL); err != nil {
			return fmt.Errorf("advertise_url: %w", err)
		}
	}
	return nil
}

func checkMeasurement(m *wire.Measurement) error {
	if err := grammar.CapacityKey(m.CapacityKey); err != nil {
		return fmt.Errorf("measurement: %w", err)
	}
	if m.Model != "" {
		if err := grammar.Model(m.Model); err != nil {
			return fmt.Errorf("measurement: %w", err)
		}
	}
	return nil
}

// offerable returns the measurements a hello offers that keep the grammar
// of what the coordinator stores; the others are logged and dropped (the
// fleet judges the rest, and a bad offer never refuses a connection).
func offerable(ms []wire.CachedMeasurement, log hclog.Logger) []wire.CachedMeasurement {
	var ok []wire.CachedMeasurement
	for _, o := range ms {
		if err := checkMeasurement(&o.Measurement); err != nil {
			log.Warn("refusing a measurement the agent offered; the worker is measured instead", "capacity_key", wire.Clip(o.Measurement.CapacityKey, 80), "why", err)
			continue
		}
		ok = append(ok, o)
	}
	return ok
}
