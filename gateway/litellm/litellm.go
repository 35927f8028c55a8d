// Package litellm keeps a LiteLLM proxy's model_list in step with heft: it
// renders a YAML file holding only model_list (LiteLLM's main config pulls
// it in with "include:"), one Deployment per serving worker with its
// weight, writes it atomically when it changed and runs an optional
// command after writing (for example one that restarts LiteLLM).
//
// LiteLLM's default routing (simple-shuffle) picks a Deployment at random
// in proportion to litellm_params.weight, a float, so heft's weights are
// written as they are, rounded to three decimals, or three significant
// digits below 0.1 (never 0). Drained workers are left out of the list.
// Each worker's max_context_tokens is its model_info.max_input_tokens, for
// the router's pre-call checks.
package litellm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"gopkg.in/yaml.v3"

	"heft/gateway/filewrite"
	"heft/gateway/render"
	"heft/gateway/target"
)

// Config is one [[litellm]] table.
type Config struct {
	Model string // the coordinator's model name
	File  string
	// Command runs after the file changed, e.g. a restart of LiteLLM.
	Command []string
	// ModelName is the name LiteLLM's clients ask for (default: Model).
	ModelName string
	// Provider prefixes litellm_params.model (default "hosted_vllm", for
	// vLLM and any OpenAI-compatible engine; "openai" works as well).
	Provider string
	// APIKey, when set, is written as litellm_params.api_key, e.g.
	// "os.environ/VLLM_API_KEY".
	APIKey  string
	Timeout time.Duration // for Command (default 60 s)
}

// File is one model_list file, shared by every [[litellm]] table that
// names it.
type File struct {
	path    string
	command []string
	timeout time.Duration
	log     hclog.Logger

	mu     sync.Mutex
	models map[string][]Deployment // by Config.ModelName: two tables may follow one model (decode and prefill)
	// names are the ModelNames of the tables writing the file: the entries
	// of one that has applied nothing yet are kept as the file has them.
	names          map[string]bool
	commandPending bool
}

// Validate returns every problem with cfg that needs no look at the disk.
func (cfg Config) Validate() error {
	var errs []error
	if cfg.Model == "" || cfg.File == "" {
		errs = append(errs, errors.New("model and file are required"))
	}
	if cfg.File != "" && !filepath.IsAbs(cfg.File) {
		errs = append(errs, fmt.Errorf("file %q is not an absolute path", cfg.File))
	}
	return errors.Join(errs...)
}

// NewFile returns the writer of one file.
func NewFile(path string, command []string, timeout time.Duration, logger hclog.Logger) (*File, error) {
	if !filepath.IsAbs(path) {
		return nil, fmt.Errorf("litellm file %q is not an absolute path", path)
	}
	if st, err := os.Stat(filepath.Dir(path)); err != nil || !st.IsDir() {
		return nil, fmt.Errorf("litellm file %q: its folder does not exist", path)
	}
	if timeout <= 0 {
		timeout = 60 * time.Second
	}
	return &File{path: path, command: command, timeout: timeout, models: map[string][]Deployment{}, names: map[string]bool{},
		log: logger.Named("litellm").With("file", path)}, nil
}

// Deployment is one entry of model_list.
type Deployment = render.Deployment

// Params are a deployment's litellm_params.
type Params = render.Params

// Target is one model in a file.
type Target struct {
	f   *File
	cfg Config
}

// Target returns the target of one [[litellm]] table writing to f.
func (f *File) Target(cfg Config) (*Target, error) {
	if cfg.Model == "" {
		return nil, errors.New("litellm: model is empty")
	}
	if cfg.ModelName == "" {
		cfg.ModelName = cfg.Model
	}
	if cfg.Provider == "" {
		cfg.Provider = "hosted_vllm"
	}
	f.mu.Lock()
	f.names[cfg.ModelName] = true
	f.mu.Unlock()
	return &Target{f: f, cfg: cfg}, nil
}

// Name implements target.Target.
func (t *Target) Name() string { return "litellm:" + t.cfg.ModelName }

// Model implements target.Target.
func (t *Target) Model() string { return t.cfg.Model }

// Deployments returns the model_list entries of m's serving workers.
func Deployments(cfg Config, m target.Model) ([]Deployment, float64) {
	return render.Deployments(render.LiteLLM{ModelName: cfg.ModelName, Provider: cfg.Provider, APIKey: cfg.APIKey}, m)
}

// Apply implements target.Target.
func (t *Target) Apply(ctx context.Context, m target.Model) (target.Result, error) {
	ds, rounding := Deployments(t.cfg, m)
	res := target.Result{RoundingError: rounding, Serving: len(ds)}
	changes, err := t.f.put(ctx, t.cfg.ModelName, ds)
	res.Changes = changes
	return res, err
}

func (f *File) put(ctx context.Context, modelName string, ds []Deployment) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.models[modelName] = ds
	old, err := filewrite.Read(f.path)
	if err != nil {
		return nil, target.Fail(target.ReasonWrite, err)
	}
	data, err := f.render(f.notYetApplied(old))
	if err != nil {
		return nil, target.Fail(target.ReasonOther, err)
	}
	var changes []string
	if !bytes.Equal(old, data) {
		if err := filewrite.Atomic(f.path, data, 0o644); err != nil {
			return nil, target.Fail(target.ReasonWrite, err)
		}
		changes = append(changes, "wrote "+f.path)
		f.commandPending = len(f.command) > 0
	}
	if f.commandPending {
		if err := filewrite.Run(ctx, f.command, f.timeout); err != nil {
			// LiteLLM runs what the file said before: put that back, after
			// every failure, so the next put, by this heft-sync or one
			// restarted, writes and runs the command again. Left in place
			// after a second failure, a restart found the new file and
			// never ran the command.
			if old != nil && !bytes.Equal(old, data) && filewrite.Atomic(f.path, old, 0o644) == nil {
				f.commandPending = false
				return changes, target.Failf(target.ReasonCommand, "the command failed, so the last good %s is back (tried again at the next sync): %v", f.path, err)
			}
			return changes, target.Failf(target.ReasonCommand, "%s is written but the command failed (tried again at the next sync): %v", f.path, err)
		}
		f.commandPending = false
		changes = append(changes, "ran the command")
	}
	return changes, nil
}

// notYetApplied is what the file holds now of the tables that have
// applied nothing since heft-sync started (f.mu held): one table's first
// write must not take the others' deployments out of LiteLLM, least of all
// those of a model the coordinator lists no worker of.
func (f *File) notYetApplied(old []byte) []Deployment {
	if old == nil || len(f.models) == len(f.names) {
		return nil // every table has applied: the file is all heft's state
	}
	ds, err := readModelList(old)
	if err != nil {
		f.log.Warn("the file as it is cannot be read; it is written again from heft's state alone", "error", err)
		return nil
	}
	var keep []Deployment
	for _, d := range ds {
		if _, applied := f.models[d.ModelName]; f.names[d.ModelName] && !applied {
			keep = append(keep, d)
		}
	}
	return keep
}

// readModelList reads the model_list of a file heft-sync wrote.
func readModelList(data []byte) ([]Deployment, error) {
	var doc struct {
		ModelList []Deployment `yaml:"model_list"`
	}
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, err
	}
	return doc.ModelList, nil
}

// Served implements syncer.Reader: the file's deployments of this table's
// model name, by the address of their api_base, with their weights.
func (t *Target) Served(context.Context) ([]target.Served, error) {
	old, err := filewrite.Read(t.f.path)
	if err != nil || old == nil {
		return nil, err
	}
	ds, err := readModelList(old)
	if err != nil {
		return nil, err
	}
	var out []target.Served
	for _, d := range ds {
		u, err := url.Parse(d.LiteLLMParams.APIBase)
		if d.ModelName != t.cfg.ModelName || err != nil || u.Host == "" || !(d.LiteLLMParams.Weight > 0) {
			continue
		}
		port := u.Port()
		if port == "" {
			port = "80"
			if u.Scheme == "https" {
				port = "443"
			}
		}
		out = append(out, target.Served{Address: net.JoinHostPort(u.Hostname(), port), Weight: float64(d.LiteLLMParams.Weight), Owned: true})
	}
	return out, nil
}

func (f *File) render(carried []Deployment) ([]byte, error) {
	all := slices.Clone(carried)
	for _, ds := range f.models {
		all = append(all, ds...)
	}
	data, err := render.ModelList(all)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", f.path, err)
	}
	return data, nil
}
