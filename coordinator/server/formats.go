package server

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"regexp"
	"strings"
	"time"

	"heft/gateway/render"
	"heft/gateway/target"
	"heft/shared/view"
)

// One-shot renderings of a model's weights, for config management (an
// Ansible template, a cron job): GET /api/v1/models/{model}/weights with
// ?format=haproxy (server lines for a backend section; ?agent_check=
// HOST:PORT[&agent_inter=2s] makes them ask the coordinator's agent-check
// responder for their state, agentcheck.go), ?format=nginx (a
// whole upstream block; ?upstream=NAME, ?max_conns=true) or
// ?format=litellm (a model_list document; ?model_name=, ?provider=). They
// render every worker of the model as heft-sync would apply it (package
// gateway/render): serving workers (admitted, and stale ones, whose agent
// is gone but not their engine) with their weights and caps, held,
// offline and unmeasured ones disabled or down (left out for LiteLLM).
// format=json, or none, is the JSON weight table. With ?kind=prefill every
// format renders the prefill weights instead, as a heft-sync table with
// kind = "prefill" applies them, and LiteLLM's deployments carry each
// worker's max_context_tokens as model_info.max_input_tokens.

// Formats lists the renderings, for the error that names them.
var formats = []string{"json", "haproxy", "nginx", "litellm"}

// renderWeights answers a ?format= other than json. It reports whether
// the request was one (false: serve the JSON table).
func (s *Server) renderWeights(w http.ResponseWriter, r *http.Request, model, kind string) bool {
	q := r.URL.Query()
	format := q.Get("format")
	if format == "" || format == "json" {
		return false
	}
	var ws []view.Worker
	for _, wk := range s.fleet.Workers() {
		if wk.Model == model {
			ws = append(ws, wk)
		}
	}
	if model == "" || len(ws) == 0 {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no model %q", model))
		return true
	}
	m, problems := target.ForSelection(model, target.Selection{Kind: kind}, ws)
	which := "weights"
	if kind == view.WeightPrefill {
		which = "prefill weights"
	}
	var head bytes.Buffer
	fmt.Fprintf(&head, "# heft %s of model %q, rendered %s: %d of %d workers serve.\n",
		which, model, time.Now().UTC().Format(time.RFC3339), len(m.Serving()), len(m.Backends))
	for _, p := range problems {
		fmt.Fprintf(&head, "# %s\n", p)
	}
	var body []byte
	var rounding float64
	var contentType string
	switch format {
	case "haproxy":
		opt := render.HAProxyOptions{AgentCheck: q.Get("agent_check"), AgentInter: q.Get("agent_inter")}
		if msg := checkAgentOptions(model, opt); msg != "" {
			writeError(w, http.StatusBadRequest, msg)
			return true
		}
		body, rounding = render.HAProxy(m, opt)
		contentType = "text/plain; charset=utf-8"
		if opt.AgentCheck == "" {
			head.WriteString("# Server lines for a backend section: weights 1-256, maxconn = max_concurrency, drained workers disabled.\n")
		} else {
			head.WriteString("# Server lines for a backend section; each asks the coordinator's agent check at " + opt.AgentCheck + " for its weight and state.\n")
			if s.tokens().Viewer != "" {
				head.WriteString("# This coordinator has a viewer token: put it first in each agent-send, \"TOKEN MODEL ADDRESS\\n\".\n")
			}
		}
	case "nginx":
		upstream := q.Get("upstream")
		if upstream == "" {
			upstream = upstreamName(model)
		}
		if !isUpstreamName(upstream) {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("upstream %q is not an nginx upstream name (letters, digits, '_', '-', '.')", upstream))
			return true
		}
		body, rounding = render.NginxUpstream(render.Nginx{Upstream: upstream, MaxConns: q.Get("max_conns") == "true"}, m)
		contentType = "text/plain; charset=utf-8"
	case "litellm":
		ds, rnd := render.Deployments(render.LiteLLM{ModelName: q.Get("model_name"), Provider: q.Get("provider")}, m)
		data, err := render.ModelList(ds)
		if err != nil {
			writeError(w, http.StatusInternalServerError, err.Error())
			return true
		}
		body, rounding, contentType = data, rnd, "application/yaml; charset=utf-8"
	default:
		writeError(w, http.StatusBadRequest, fmt.Sprintf("format %q: want one of %s", format, strings.Join(formats, ", ")))
		return true
	}
	fmt.Fprintf(&head, "# Largest error of a worker's share of traffic after rounding: %.2f%%.\n", 100*rounding)
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(append(head.Bytes(), body...))
	return true
}

// checkAgentOptions refuses agent-check options HAProxy would not take,
// and a model name that cannot travel in agent-send; "" when fine.
func checkAgentOptions(model string, opt render.HAProxyOptions) string {
	if opt.AgentCheck == "" {
		if opt.AgentInter != "" {
			return "agent_inter needs agent_check=HOST:PORT"
		}
		return ""
	}
	if host, port, err := net.SplitHostPort(opt.AgentCheck); err != nil || host == "" || port == "" || strings.ContainsAny(opt.AgentCheck, " \t\"") {
		return fmt.Sprintf("agent_check %q is not host:port (the coordinator's agent_check_listen as HAProxy reaches it)", opt.AgentCheck)
	}
	if opt.AgentInter != "" && !haproxyTime.MatchString(opt.AgentInter) {
		return fmt.Sprintf("agent_inter %q is not an HAProxy time such as 2s or 500ms", opt.AgentInter)
	}
	if strings.ContainsAny(model, " \t\"\\") {
		return fmt.Sprintf("model %q holds a space, quote or backslash, which agent-send cannot carry", model)
	}
	return ""
}

var haproxyTime = regexp.MustCompile(`^[0-9]{1,9}(us|ms|s|m|h|d)?$`)

// upstreamName makes an nginx upstream name of a model name.
func upstreamName(model string) string {
	return strings.Map(func(r rune) rune {
		if r == '_' || r == '-' || r == '.' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' {
			return r
		}
		return '_'
	}, model)
}

func isUpstreamName(s string) bool { return s != "" && upstreamName(s) == s && len(s) <= 128 }
