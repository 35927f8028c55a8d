package render

import (
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"heft/gateway/target"
)

// A Format is one named rendering of a model's weights, as the
// coordinator's GET /api/v1/models/{model}/weights?format=NAME serves it:
// the coordinator asks the registry by name and knows no gateway's
// syntax.
type Format struct {
	Name        string
	ContentType string
	// Render renders m with the request's options.
	Render func(m target.Model, req Request) (Output, error)
}

// Request is what a rendering may take from the request that asked.
type Request struct {
	Query url.Values // the format's own options: ?upstream=, ?agent_check=, ...
	// ViewerToken is set when the coordinator has a viewer token, which
	// HAProxy's agent check must then send.
	ViewerToken bool
}

// Output is a rendering.
type Output struct {
	Body     []byte
	Rounding float64 // the largest error of a serving worker's share
	// Notes are lines for the header comment, without the "# ".
	Notes []string
}

// OptionError is an option the format refuses: the asker's mistake.
type OptionError struct{ Err error }

func (e *OptionError) Error() string { return e.Err.Error() }
func (e *OptionError) Unwrap() error { return e.Err }

func optionErr(err error) error {
	if err == nil {
		return nil
	}
	return &OptionError{Err: err}
}

// IsOptionError reports whether err is a refused option.
func IsOptionError(err error) bool {
	var oe *OptionError
	return errors.As(err, &oe)
}

// Formats lists the renderings, by name; every one writes "#" comments,
// so a header of "# " lines goes in front of any of them.
var formats = []Format{
	{Name: "haproxy", ContentType: "text/plain; charset=utf-8", Render: renderHAProxy},
	{Name: "nginx", ContentType: "text/plain; charset=utf-8", Render: renderNginx},
	{Name: "litellm", ContentType: "application/yaml; charset=utf-8", Render: renderLiteLLM},
}

// Lookup returns the format named name.
func Lookup(name string) (Format, bool) {
	for _, f := range formats {
		if f.Name == name {
			return f, true
		}
	}
	return Format{}, false
}

// FormatNames lists the formats' names.
func FormatNames() []string {
	out := make([]string, len(formats))
	for i, f := range formats {
		out[i] = f.Name
	}
	return out
}

// DefaultAgentTokenEnv is the variable of HAProxy's environment whose
// value agent-send carries first when the coordinator has a viewer token
// (?agent_token_env= names another).
const DefaultAgentTokenEnv = "HEFT_VIEWER_TOKEN"

func renderHAProxy(m target.Model, req Request) (Output, error) {
	opt := HAProxyOptions{AgentCheck: req.Query.Get("agent_check"), AgentInter: req.Query.Get("agent_inter"),
		AgentTokenEnv: req.Query.Get("agent_token_env")}
	switch {
	case opt.AgentCheck == "" && opt.AgentInter != "":
		return Output{}, optionErr(errors.New("agent_inter needs agent_check=HOST:PORT"))
	case opt.AgentCheck == "" && opt.AgentTokenEnv != "":
		return Output{}, optionErr(errors.New("agent_token_env needs agent_check=HOST:PORT"))
	}
	switch {
	case opt.AgentTokenEnv != "" && !req.ViewerToken:
		return Output{}, optionErr(errors.New("agent_token_env: this coordinator has no viewer token, so its agent checks take none"))
	case opt.AgentCheck != "" && req.ViewerToken && opt.AgentTokenEnv == "":
		opt.AgentTokenEnv = DefaultAgentTokenEnv
	}
	body, rounding, err := HAProxy(m, opt)
	if err != nil {
		return Output{}, optionErr(err)
	}
	out := Output{Body: body, Rounding: rounding}
	if opt.AgentCheck == "" {
		out.Notes = append(out.Notes, "Server lines for a backend section: weights 1-256, maxconn = max_concurrency, drained workers disabled.")
	} else {
		out.Notes = append(out.Notes, "Server lines for a backend section; each asks the coordinator's agent check at "+opt.AgentCheck+" for its weight and state.")
	}
	if healthRoute(m) == "" {
		out.Notes = append(out.Notes, "The engines' health routes differ: each server's check is a connect check; add the backend's option httpchk yourself.")
	}
	out.Notes = append(out.Notes, "Each server has HAProxy's own health check: with retries 3 and option redispatch 1 in defaults, an engine that dies fails no request.")
	if opt.AgentCheck != "" && req.ViewerToken {
		out.Notes = append(out.Notes, "This coordinator has a viewer token: each agent-send carries ${"+opt.AgentTokenEnv+"}, which HAProxy fills from its environment "+
			"when it starts: put "+opt.AgentTokenEnv+"=TOKEN in /etc/default/haproxy (or /etc/sysconfig/haproxy; mode 0600), which haproxy.service reads, and restart HAProxy (a reload keeps the old environment).")
	}
	return out, nil
}

func renderNginx(m target.Model, req Request) (Output, error) {
	upstream := req.Query.Get("upstream")
	if upstream == "" {
		upstream = UpstreamName(m.Name)
	}
	if !IsUpstreamName(upstream) {
		return Output{}, optionErr(fmt.Errorf("upstream %s is not an nginx upstream name (letters, digits, '_', '-', '.')", strconv.QuoteToASCII(upstream)))
	}
	body, rounding, err := NginxUpstream(Nginx{Upstream: upstream, MaxConns: req.Query.Get("max_conns") == "true"}, m)
	if err != nil {
		return Output{}, optionErr(err)
	}
	return Output{Body: body, Rounding: rounding}, nil
}

func renderLiteLLM(m target.Model, req Request) (Output, error) {
	ds, rounding := Deployments(LiteLLM{ModelName: req.Query.Get("model_name"), Provider: req.Query.Get("provider")}, m)
	body, err := ModelList(ds)
	if err != nil {
		return Output{}, err
	}
	return Output{Body: body, Rounding: rounding}, nil
}

// UpstreamName makes an nginx upstream name of a model name: what nginx
// does not take in one becomes '_', clipped to 128 bytes.
func UpstreamName(model string) string {
	s := strings.Map(func(r rune) rune {
		if r == '_' || r == '-' || r == '.' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' {
			return r
		}
		return '_'
	}, model)
	if len(s) > 128 {
		s = s[:128]
	}
	return s
}
