package server

import (
	"bytes"
	"fmt"
	"net/http"
	"strings"
	"time"

	"heft/coordinator/view"
	"heft/gateway/render"
	"heft/gateway/target"
)

// One-shot renderings of a model's weights, for config management (an
// Ansible template, a cron job): GET /api/v1/models/{model}/weights with
// ?format=haproxy (server lines for a backend section), ?format=nginx (a
// whole upstream block; ?upstream=NAME, ?max_conns=true) or
// ?format=litellm (a model_list document; ?model_name=, ?provider=). They
// render every worker of the model as heft-sync would apply it (package
// gateway/render): serving workers with their weights and caps, held,
// offline and unmeasured ones disabled or down (left out for LiteLLM).
// format=json, or none, is the JSON weight table.

// Formats lists the renderings, for the error that names them.
var formats = []string{"json", "haproxy", "nginx", "litellm"}

// renderWeights answers a ?format= other than json. It reports whether
// the request was one (false: serve the JSON table).
func (s *Server) renderWeights(w http.ResponseWriter, r *http.Request, model string) bool {
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
	m, problems := target.ForModel(model, ws)
	var head bytes.Buffer
	fmt.Fprintf(&head, "# heft weights of model %q, rendered %s: %d of %d workers serve.\n",
		model, time.Now().UTC().Format(time.RFC3339), len(m.Serving()), len(m.Backends))
	for _, p := range problems {
		fmt.Fprintf(&head, "# %s\n", p)
	}
	var body []byte
	var rounding float64
	var contentType string
	switch format {
	case "haproxy":
		body, rounding = render.HAProxy(m)
		contentType = "text/plain; charset=utf-8"
		head.WriteString("# Server lines for a backend section: weights 1-256, maxconn = max_concurrency, drained workers disabled.\n")
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
