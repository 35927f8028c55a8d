package server

import (
	"bytes"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"heft/gateway/render"
	"heft/gateway/target"
	"heft/shared/view"
)

// One-shot renderings of a model's weights, for config management (an
// Ansible template, a cron job): GET /api/v1/models/{model}/weights with
// ?format=haproxy (server lines for a backend section; ?agent_check=
// HOST:PORT[&agent_inter=2s][&agent_token_env=NAME] makes them ask the coordinator's agent-check
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
// worker's max_context_tokens as model_info.max_input_tokens. What each
// format writes, and which options it takes, is gateway/render's: this
// file asks its registry by name.

// renderWeights answers a ?format= other than json. It reports whether
// the request was one (false: serve the JSON table).
func (s *Server) renderWeights(w http.ResponseWriter, r *http.Request, model, kind string) bool {
	q := r.URL.Query()
	name := q.Get("format")
	if name == "" || name == "json" {
		return false
	}
	format, ok := render.Lookup(name)
	if !ok {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("format %q: want one of %s", name, strings.Join(append([]string{"json"}, render.FormatNames()...), ", ")))
		return true
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
	m, leftOut := target.Clean(m)
	out, err := format.Render(m, render.Request{Query: q, ViewerToken: s.tokens().Viewer != ""})
	switch {
	case render.IsOptionError(err):
		writeError(w, http.StatusBadRequest, err.Error())
		return true
	case err != nil:
		writeError(w, http.StatusInternalServerError, err.Error())
		return true
	}
	which := "weights"
	if kind == view.WeightPrefill {
		which = "prefill weights"
	}
	// Every format takes "#" comments. Problems quote agent strings:
	// escaped, so none ends its comment line.
	var head bytes.Buffer
	fmt.Fprintf(&head, "# heft %s of model %s, rendered %s: %d of %d workers serve.\n",
		which, target.Printable(strconv.QuoteToASCII(model)), time.Now().UTC().Format(time.RFC3339), len(m.Serving()), len(m.Backends))
	for _, p := range append(append(problems, leftOut...), out.Notes...) {
		fmt.Fprintf(&head, "# %s\n", target.Printable(p))
	}
	fmt.Fprintf(&head, "# Largest error of a worker's share of traffic after rounding: %.2f%%.\n", 100*out.Rounding)
	w.Header().Set("Content-Type", format.ContentType)
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(append(head.Bytes(), out.Body...))
	return true
}
