package server

import (
	"errors"
	"fmt"
	"time"
)

// Validate returns every problem with the settings a configuration file
// sets (heft-coordinator's config binds its rows straight into Options).
// New does not need it: there a zero takes the default.
func (o Options) Validate() error {
	var errs []error
	for _, d := range []struct {
		key string
		v   time.Duration
	}{{"agent_ping_interval", o.PingInterval}, {"agent_ping_timeout", o.PingTimeout}} {
		if d.v <= 0 {
			errs = append(errs, fmt.Errorf("%s must be above zero, is %s", d.key, d.v))
		}
	}
	for _, n := range []struct {
		key string
		v   int
	}{{"max_agent_connections", o.MaxAgentConnections}, {"max_event_streams", o.MaxEventStreams}, {"max_api_requests", o.MaxAPIRequests}} {
		if n.v < 1 {
			errs = append(errs, fmt.Errorf("%s must be at least 1, is %d", n.key, n.v))
		}
	}
	return errors.Join(errs...)
}
