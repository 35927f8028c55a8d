// Package render writes a model's desired state (target.Model) in each
// gateway's own configuration language: HAProxy server lines, an nginx
// upstream block, a LiteLLM model_list. It is pure (text in, text out, no
// I/O), so heft-sync's drivers and the coordinator's one-shot renderings
// (GET /api/v1/models/{model}/weights?format=...) share one rendering.
package render

import (
	"bytes"
	"cmp"
	"fmt"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"heft/gateway/scale"
	"heft/gateway/target"
)

// Weight ranges: HAProxy takes 1–256 (its runtime API's limit too); nginx
// takes any positive integer, and 100 keeps the file readable and the
// ratios within a few tenths of a per cent for heft's weights (0.25–8).
const (
	HAProxyMaxWeight = 256
	NginxMaxWeight   = 100
)

// intWeights scales the serving backends' weights to 1..hi, by address.
func intWeights(m target.Model, hi int) (map[string]int, float64) {
	serving := m.Serving()
	fs := make([]float64, len(serving))
	for i, b := range serving {
		fs[i] = b.Weight
	}
	ints, rounding := scale.Ints(fs, hi)
	out := make(map[string]int, len(serving))
	for i, b := range serving {
		out[b.Address] = ints[i]
	}
	return out, rounding
}

// HAProxyOptions shape HAProxy's server lines.
type HAProxyOptions struct {
	// AgentCheck, host:port of a coordinator's agent-check responder,
	// makes every server ask it for its state (agent-check): each server
	// is written with weight 100, the base of the percentages it answers.
	AgentCheck string
	// AgentInter is the agent check's interval (default 2s).
	AgentInter string
	// AgentTokenEnv, when set, names the environment variable of
	// HAProxy's that holds the token agent-send carries first: written
	// "${NAME}", HAProxy puts the value there when it reads its
	// configuration, so the token stays out of the file and off every
	// server line.
	AgentTokenEnv string
}

// HealthRoute is the path of an engine kind's health route, which
// HAProxy's "option httpchk" asks: /health for vLLM, SGLang, llama.cpp,
// mlx-lm (and an engine kind heft does not know); Ollama has none, and
// answers /api/version once it runs.
func HealthRoute(kind string) string {
	if kind == "ollama" {
		return "/api/version"
	}
	return "/health"
}

// haproxyCheck is the health check of every rendered server: the timing
// of docs/gateways.md's example backend.
const haproxyCheck = " check inter 2s fall 2 rise 2"

// haproxyCheckTimeout is the backend's "timeout check": without it HAProxy
// gives a whole check, connect and answer, only "inter" (2 s), and an
// engine whose /health is late because its API server is saturated (vLLM
// and SGLang answer it on the event loop that serves the requests) is
// marked down while it serves: under load every engine at once, and the
// backend answers 503. With it, the connect keeps min(inter, timeout
// connect) and the answer 5 s more, so an engine that hangs is still
// marked down within about 14 s (two checks of 5 s, inter apart).
const haproxyCheckTimeout = "    timeout check 5s\n"

// healthRoute is the one health route of m's engines; "" when they differ
// (HAProxy has one httpchk per backend: a connect check is what is left).
func healthRoute(m target.Model) string {
	route := HealthRoute("")
	for i, b := range m.Backends {
		r := HealthRoute(b.Engine)
		if i > 0 && r != route {
			return ""
		}
		route = r
	}
	return route
}

// HAProxy returns the server lines of a backend for m, indented for a
// "backend" section, and the rounding error of the weights. The first
// line is the backend's "option httpchk GET ROUTE" of its engines' health
// route (left out when they differ), then its "timeout check" (see
// haproxyCheckTimeout), and every server has "check": the
// gateway's own health check takes an engine that dies out whatever heft
// says (with "retries" and "option redispatch" in the defaults, no
// request fails for it). Serving
// workers come first, heaviest first (so "balance first" fills the
// fastest one first), each with its weight in 1–256 and, when known,
// "maxconn" = its max_concurrency; held, offline and unmeasured workers
// follow as "disabled" (maintenance: no traffic until the next rendering,
// or the agent check, says otherwise). Each line ends with a comment
// naming the worker.
//
// A worker whose address or weight cannot be written (target.Clean) is
// left out; an agent check whose address, interval or model name HAProxy
// would not read as one word is refused with an error.
func HAProxy(m target.Model, opt HAProxyOptions) ([]byte, float64, error) {
	m, _ = target.Clean(m)
	agent := ""
	if opt.AgentCheck != "" {
		if err := checkAgentCheck(m.Name, opt); err != nil {
			return nil, 0, err
		}
		host, port, _ := net.SplitHostPort(opt.AgentCheck)
		inter := cmp.Or(opt.AgentInter, "2s")
		agent = fmt.Sprintf(" agent-check agent-addr %s agent-port %s agent-inter %s", host, port, inter)
	}
	weights, rounding := intWeights(m, HAProxyMaxWeight)
	bs := slices.Clone(m.Backends)
	slices.SortStableFunc(bs, func(a, b target.Backend) int {
		if a.Serving != b.Serving {
			if a.Serving {
				return -1
			}
			return 1
		}
		return cmp.Or(cmp.Compare(b.Weight, a.Weight), cmp.Compare(a.Address, b.Address))
	})
	var buf bytes.Buffer
	if route := healthRoute(m); route != "" && len(bs) > 0 {
		fmt.Fprintf(&buf, "    option httpchk GET %s\n", route)
	}
	if len(bs) > 0 {
		buf.WriteString(haproxyCheckTimeout)
	}
	for _, b := range bs {
		line := fmt.Sprintf("    server %s %s", HAProxyServerName(b.Address), b.Address)
		if b.Scheme == "https" {
			line += " ssl verify required ca-file @system-ca"
		}
		w, ok := weights[b.Address]
		switch {
		case agent != "":
			line += " weight 100"
		case ok:
			line += fmt.Sprintf(" weight %d", w)
		default:
			line += " weight 1"
		}
		if b.MaxConcurrency > 0 {
			line += fmt.Sprintf(" maxconn %d", b.MaxConcurrency)
		}
		line += haproxyCheck
		if !b.Serving {
			line += " disabled"
		}
		if agent != "" {
			tok := ""
			if opt.AgentTokenEnv != "" {
				tok = "${" + opt.AgentTokenEnv + "} "
			}
			line += agent + fmt.Sprintf(` agent-send "%s%s %s\n"`, tok, m.Name, b.Address)
		}
		fmt.Fprintf(&buf, "%s  # %s, %s\n", line, describe(b), target.Printable(b.WorkerID))
	}
	return buf.Bytes(), rounding, nil
}

// checkAgentCheck refuses agent-check options HAProxy would not read as
// one word each, and a model name that cannot travel in agent-send's
// quoted "MODEL ADDRESS\n".
func checkAgentCheck(model string, opt HAProxyOptions) error {
	if err := target.CheckAddress(opt.AgentCheck); err != nil {
		return fmt.Errorf("agent_check %s is not host:port (the coordinator's agent_check_listen as HAProxy reaches it): %w", strconv.QuoteToASCII(opt.AgentCheck), err)
	}
	if opt.AgentInter != "" && !haproxyTime.MatchString(opt.AgentInter) {
		return fmt.Errorf("agent_inter %q is not an HAProxy time such as 2s or 500ms", opt.AgentInter)
	}
	if opt.AgentTokenEnv != "" && !envName.MatchString(opt.AgentTokenEnv) {
		return fmt.Errorf("agent_token_env %s is not an environment variable's name (letters, digits and _, not first a digit)", strconv.QuoteToASCII(opt.AgentTokenEnv))
	}
	if !AgentSendable(model) {
		return fmt.Errorf("model %s holds a character agent-send cannot carry (a space, quote, backslash, '#' or one outside printable ASCII)", strconv.QuoteToASCII(model))
	}
	return nil
}

var (
	haproxyTime = regexp.MustCompile(`^[0-9]{1,9}(us|ms|s|m|h|d)?$`)
	envName     = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,63}$`)
)

// AgentSendable reports whether a model name can be written inside
// agent-send's double quotes as it is: 1–256 bytes of printable ASCII
// without a space, '"', '\\', '#' or '$' (HAProxy expands "$VAR" there).
func AgentSendable(model string) bool {
	if model == "" || len(model) > 256 {
		return false
	}
	for i := 0; i < len(model); i++ {
		c := model[i]
		if c <= ' ' || c > '~' || strings.IndexByte(`"\#$'`, c) >= 0 {
			return false
		}
	}
	return true
}

// HAProxyServerName is a server name for an address: "heft-" and the
// address, with what HAProxy does not take in a name replaced by "_".
func HAProxyServerName(addr string) string {
	return "heft-" + strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_', r == '.':
			return r
		case r == ':':
			return '-'
		default:
			return '_'
		}
	}, strings.NewReplacer("[", "", "]", "").Replace(addr))
}

func describe(b target.Backend) string {
	if b.Serving {
		return fmt.Sprintf("%s, weight %.3g", target.Printable(b.State), b.Weight)
	}
	return target.Printable(b.State)
}

// Nginx describes an upstream block.
type Nginx struct {
	Upstream string
	// Directives go inside the block before the servers, one each,
	// without the ";": "least_conn", "keepalive 32".
	Directives []string
	// MaxConns writes max_conns= from max_concurrency. nginx OSS has no
	// queue behind it: a full upstream answers 502 instead of waiting.
	MaxConns bool
}

// NginxUpstream returns a whole file holding m's upstream block, and the
// rounding error: serving workers with "weight=" in 1–100, the others
// "down", each line with a comment naming its state and worker. A worker
// whose address or weight cannot be written (target.Clean) is left out;
// an upstream name or directive that is not one nginx word or statement
// is refused with an error.
func NginxUpstream(cfg Nginx, m target.Model) ([]byte, float64, error) {
	if !IsUpstreamName(cfg.Upstream) {
		return nil, 0, fmt.Errorf("upstream %s is not an nginx upstream name (1-128 letters, digits, '_', '-', '.')", strconv.QuoteToASCII(cfg.Upstream))
	}
	for _, d := range cfg.Directives {
		if !IsDirective(d) {
			return nil, 0, fmt.Errorf("directive %s: want one directive of printable ASCII without ';', braces, quotes or comments", strconv.QuoteToASCII(d))
		}
	}
	m, _ = target.Clean(m)
	weights, rounding := intWeights(m, NginxMaxWeight)
	var buf bytes.Buffer
	fmt.Fprintf(&buf, "# Written by heft for model %s; it is rewritten from heft's weights, so change the settings that render it instead.\n", target.Printable(strconv.QuoteToASCII(m.Name)))
	fmt.Fprintf(&buf, "upstream %s {\n", cfg.Upstream)
	for _, d := range cfg.Directives {
		fmt.Fprintf(&buf, "    %s;\n", strings.TrimSpace(d))
	}
	for _, b := range m.Backends {
		line := "    server " + b.Address
		if w, ok := weights[b.Address]; ok {
			line += fmt.Sprintf(" weight=%d", w)
			if cfg.MaxConns && b.MaxConcurrency > 0 {
				line += fmt.Sprintf(" max_conns=%d", b.MaxConcurrency)
			}
			line += ";"
		} else {
			line += " down;"
		}
		fmt.Fprintf(&buf, "%-48s # %s, %s\n", line, target.Printable(b.State), target.Printable(b.WorkerID))
	}
	buf.WriteString("}\n")
	return buf.Bytes(), rounding, nil
}

// IsUpstreamName reports whether s is an nginx upstream name heft writes:
// 1–128 letters, digits, '_', '-' and '.'.
func IsUpstreamName(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c == '_' || c == '-' || c == '.' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			return false
		}
	}
	return true
}

// IsDirective reports whether d is one nginx directive heft may write
// inside an upstream block: printable ASCII, no ';', braces, quotes,
// backslash or '#' (each could end it or open a block), not blank.
func IsDirective(d string) bool {
	if strings.TrimSpace(d) == "" || len(d) > 1024 {
		return false
	}
	for i := 0; i < len(d); i++ {
		c := d[i]
		if c < ' ' || c > '~' || strings.IndexByte(";{}#\"'\\", c) >= 0 {
			return false
		}
	}
	return true
}

// LiteLLM describes the deployments of one model in a model_list.
type LiteLLM struct {
	// ModelName is what LiteLLM's clients ask for (default: the model).
	ModelName string
	// Provider prefixes litellm_params.model (default "hosted_vllm").
	Provider string
	// APIKey, when set, is written as litellm_params.api_key, e.g.
	// "os.environ/VLLM_API_KEY".
	APIKey string
}

// Deployment is one entry of LiteLLM's model_list. Its strings are tagged
// "flow" so yaml.v3 writes one holding a line break double-quoted: its
// literal block for a string that starts with one ("\n") reads back as ""
// (FuzzModelList found it), a model name LiteLLM would not match.
type Deployment struct {
	ModelName     string     `yaml:"model_name,flow"`
	LiteLLMParams Params     `yaml:"litellm_params"`
	ModelInfo     *ModelInfo `yaml:"model_info,omitempty"`
}

// ModelInfo is a deployment's model_info. LiteLLM's router, with
// enable_pre_call_checks, leaves out a deployment whose max_input_tokens a
// request's prompt exceeds, so long prompts go only to workers that can
// hold them.
type ModelInfo struct {
	// MaxInputTokens is the worker's max_context_tokens: what it holds of
	// prompt and answer together.
	MaxInputTokens int64 `yaml:"max_input_tokens"`
}

// Params are a deployment's litellm_params.
type Params struct {
	Model               string  `yaml:"model,flow"`
	APIBase             string  `yaml:"api_base,flow"`
	APIKey              string  `yaml:"api_key,omitempty,flow"`
	Weight              Decimal `yaml:"weight"`
	MaxParallelRequests int     `yaml:"max_parallel_requests,omitempty"`
}

// Decimal is a number written in plain decimals. yaml.v3 writes 0.00001
// as 1e-05, which LiteLLM's YAML 1.1 parser (PyYAML) reads as a string,
// and a string weight fails simple-shuffle's sum on every request.
type Decimal float64

// MarshalYAML implements yaml.Marshaler.
func (d Decimal) MarshalYAML() (any, error) {
	return &yaml.Node{Kind: yaml.ScalarNode, Value: strconv.FormatFloat(float64(d), 'f', -1, 64)}, nil
}

// Deployments returns the model_list entries of m's serving workers (the
// others are left out), and the error of writing the weights rounded
// (liteLLMWeight), in the same terms as the integer gateways' rounding
// error. LiteLLM's simple-shuffle picks a deployment at random in
// proportion to litellm_params.weight.
func Deployments(cfg LiteLLM, m target.Model) ([]Deployment, float64) {
	if cfg.ModelName == "" {
		cfg.ModelName = m.Name
	}
	if cfg.Provider == "" {
		cfg.Provider = "hosted_vllm"
	}
	m, _ = target.Clean(m)
	var out []Deployment
	var want []float64
	var got []float64
	for _, b := range m.Serving() {
		w := liteLLMWeight(b.Weight)
		want, got = append(want, b.Weight), append(got, w)
		d := Deployment{ModelName: cfg.ModelName, LiteLLMParams: Params{
			Model:               cfg.Provider + "/" + m.Name,
			APIBase:             b.Scheme + "://" + b.Address + "/v1",
			APIKey:              cfg.APIKey,
			Weight:              Decimal(w),
			MaxParallelRequests: b.MaxConcurrency,
		}}
		if b.MaxContextTokens > 0 {
			d.ModelInfo = &ModelInfo{MaxInputTokens: b.MaxContextTokens}
		}
		out = append(out, d)
	}
	return out, scale.ShareError(want, got)
}

// liteLLMWeight is w (above 0) rounded to three decimals, or to three
// significant digits where that is finer: with three decimals alone a
// weight under 0.0005 became 0, which simple-shuffle never picks (and
// a model whose weights are all 0 fails every request: it divides by
// their sum).
func liteLLMWeight(w float64) float64 {
	s := strconv.FormatFloat(w, 'f', 3, 64)
	if w < 0.1 {
		s = strconv.FormatFloat(w, 'g', 3, 64)
	}
	r, _ := strconv.ParseFloat(s, 64)
	return r
}

// ModelList renders deployments as a YAML document holding only
// model_list (LiteLLM's config.yaml pulls it in with "include:"), sorted
// by model name and api_base.
func ModelList(ds []Deployment) ([]byte, error) {
	all := slices.Clone(ds)
	slices.SortFunc(all, func(a, b Deployment) int {
		return cmp.Or(cmp.Compare(a.ModelName, b.ModelName), cmp.Compare(a.LiteLLMParams.APIBase, b.LiteLLMParams.APIBase))
	})
	if all == nil {
		all = []Deployment{}
	}
	var buf bytes.Buffer
	buf.WriteString("# Written by heft from the coordinator's weights; include it from LiteLLM's config.yaml.\n")
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(map[string][]Deployment{"model_list": all}); err != nil {
		return nil, fmt.Errorf("render model_list: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("render model_list: %w", err)
	}
	return buf.Bytes(), nil
}
