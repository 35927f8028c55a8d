// Package launch reads an engine's launch arguments from its command
// line, normalises them, and derives the capacity key from them: the
// rules that decide when a restarted engine is "the same worker".
package launch

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// Launch-argument normalisation. The capacity key hashes these, so the
// rules decide when a restart counts as "the same worker":
//
//  1. Keys lose leading dashes, are lower-cased, and '-' becomes '_'
//     (--tensor-parallel-size, tensor_parallel_size and
//     TENSOR-PARALLEL-SIZE are one key).
//  2. Common aliases collapse onto one name: tp/tp_size → tensor_parallel_size,
//     dp/dp_size → data_parallel_size, pp/pp_size → pipeline_parallel_size,
//     model_tag/model_path/m → model, llama.cpp's short flags (c, np, ngl,
//     b, ub, t, fa) to their long names.
//  3. Secrets are dropped: api_key, hf_token, any key ending in _token,
//     _secret, _password or _key (kv_cache keys excepted), ssl_* files,
//     watermark_config.
//  4. Noise is dropped: flags that change logging, the listening host,
//     request logging, CORS, seeds, and the per-launch random_seed, which
//     SGLang fills with a fresh random number when unset.
//  5. Values lose surrounding quotes; None/null values are dropped;
//     booleans become true/false; numbers are written in their shortest
//     form (0.90 → 0.9, 1e3 → 1000).
//  6. The result is "key=value", sorted by key.
//
// port is kept on purpose: two engines of one model on one node differ
// by it, and the coordinator must see them as two workers.

var argAliases = map[string]string{
	"tp":         "tensor_parallel_size",
	"tp_size":    "tensor_parallel_size",
	"dp":         "data_parallel_size",
	"dp_size":    "data_parallel_size",
	"pp":         "pipeline_parallel_size",
	"pp_size":    "pipeline_parallel_size",
	"model_tag":  "model",
	"model_path": "model",
	"m":          "model",
	"c":          "ctx_size",
	"np":         "parallel",
	"ngl":        "n_gpu_layers",
	"gpu_layers": "n_gpu_layers",
	"b":          "batch_size",
	"ub":         "ubatch_size",
	"t":          "threads",
	"fa":         "flash_attn",
	"mem_frac":   "mem_fraction_static",
}

var noiseArgs = map[string]bool{
	"host": true, "log_level": true, "log_level_http": true, "uvicorn_log_level": true,
	"disable_log_requests": true, "enable_log_requests": true, "disable_log_stats": true,
	"log_requests": true, "log_requests_level": true, "disable_uvicorn_access_log": true,
	"enable_request_time_stats_logging": true, "decode_log_interval": true, "log_config_file": true,
	"max_log_len": true, "show_hidden_metrics_for_version": true, "random_seed": true, "seed": true,
	"allowed_origins": true, "allowed_methods": true, "allowed_headers": true, "allow_credentials": true,
	"root_path": true, "verbose": true, "v": true, "log_disable": true, "log_file": true, "log_colors": true,
	"log_prefix": true, "log_timestamps": true, "log_verbosity": true, "api_key_file": true,
	"watermark_config": true, "download_dir": true, "enable_metrics": true, "metrics": true,
	"enable_metrics_for_all_schedulers": true, "slots": true, "no_slots": true, "props": true,
}

// IsSecret reports whether a normalised key names a secret that must
// never leave the host.
func IsSecret(key string) bool {
	switch key {
	case "api_key", "hf_token", "token", "admin_api_key", "ssl_keyfile", "ssl_certfile", "ssl_ca_certs":
		return true
	}
	if strings.HasPrefix(key, "ssl_") {
		return true
	}
	if strings.HasPrefix(key, "kv_cache") || strings.HasPrefix(key, "cache_") {
		return false
	}
	for _, suffix := range []string{"_token", "_secret", "_password", "_api_key", "_key"} {
		if strings.HasSuffix(key, suffix) {
			return true
		}
	}
	return strings.Contains(key, "secret") || strings.Contains(key, "password")
}

// NormalizeKey applies rules 1 and 2 to one flag name.
func NormalizeKey(key string) string {
	k := strings.ToLower(strings.TrimSpace(strings.TrimLeft(strings.TrimSpace(key), "-")))
	k = strings.ReplaceAll(k, "-", "_")
	if a, ok := argAliases[k]; ok {
		return a
	}
	return k
}

var numberRE = regexp.MustCompile(`^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$`)

// normalizeValue applies rule 5; ok is false for a value to drop.
func normalizeValue(v string) (string, bool) {
	v = strings.TrimSpace(v)
	if len(v) >= 2 && (v[0] == '\'' && v[len(v)-1] == '\'' || v[0] == '"' && v[len(v)-1] == '"') {
		v = v[1 : len(v)-1]
	}
	switch strings.ToLower(v) {
	case "none", "null", "nil":
		return "", false
	case "true":
		return "true", true
	case "false":
		return "false", true
	}
	if numberRE.MatchString(v) && len(v) < 32 {
		if f, err := strconv.ParseFloat(v, 64); err == nil {
			return strconv.FormatFloat(f, 'g', -1, 64), true
		}
	}
	return v, true
}

// Normalize turns launch arguments into sorted "key=value" strings by
// the rules above. When aliases collide, the value of the key that sorts
// first among the originals wins, so the result does not depend on map
// order.
func Normalize(args map[string]string) []string {
	origs := make([]string, 0, len(args))
	for k := range args {
		origs = append(origs, k)
	}
	sort.Strings(origs)
	out := map[string]string{}
	for _, orig := range origs {
		k := NormalizeKey(orig)
		if k == "" || noiseArgs[k] || IsSecret(k) {
			continue
		}
		v, ok := normalizeValue(args[orig])
		if !ok {
			continue
		}
		if _, dup := out[k]; dup {
			continue
		}
		out[k] = v
	}
	list := make([]string, 0, len(out))
	for k, v := range out {
		list = append(list, k+"="+v)
	}
	sort.Strings(list)
	return list
}

// CapacityKey identifies what a measurement measured: the node, the engine
// kind, the model and the normalised launch arguments. It is the first 16
// hex digits of a SHA-256 over a length-prefixed encoding of those parts
// (so no choice of strings can make two different inputs collide by
// concatenation), stable across runs, platforms and Go versions.
func CapacityKey(node, kind, model string, normArgs []string) string {
	h := sha256.New()
	write := func(s string) {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(s)))
		h.Write(n[:])
		h.Write([]byte(s))
	}
	write("heft-capacity-key/v1")
	write(strings.TrimSpace(node))
	write(strings.ToLower(strings.TrimSpace(kind)))
	write(strings.TrimSpace(model))
	args := append([]string(nil), normArgs...)
	sort.Strings(args)
	write(strconv.Itoa(len(args)))
	for _, a := range args {
		write(a)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// boolFlags are flags that take no value even when followed by a word
// that does not start with a dash (vllm serve --enforce-eager MODEL).
var boolFlags = map[string]bool{
	"enforce_eager": true, "trust_remote_code": true, "metrics": true, "slots": true,
	"cont_batching": true, "kv_unified": true, "mlock": true, "no_mmap": true, "verbose": true,
	"embedding": true, "embeddings": true, "jinja": true, "pipeline": true, "skip_tokenizer_init": true,
	"is_embedding": true, "use_v2_block_manager": true,
}

func isBoolFlag(key string) bool {
	return boolFlags[key] || strings.HasPrefix(key, "enable_") || strings.HasPrefix(key, "disable_") ||
		strings.HasPrefix(key, "no_")
}

var pythonRE = regexp.MustCompile(`^python[0-9.]*$`)

// Program returns what a command line launches: the program's base name,
// or for a Python interpreter the module (-m) or script it runs.
// "python3 -u -m sglang.launch_server --dp 2" gives "sglang.launch_server".
func Program(argv []string) string {
	prog, _ := splitProgram(argv)
	return prog
}

// splitProgram finds what is launched and where its own arguments start:
// "python3 -u -m sglang.launch_server --dp 2" gives "sglang.launch_server"
// and the index of "--dp".
func splitProgram(argv []string) (prog string, rest int) {
	if len(argv) == 0 {
		return "", 0
	}
	prog = filepath.Base(argv[0])
	i := 1
	if pythonRE.MatchString(prog) {
		prog = ""
		for i < len(argv) {
			a := argv[i]
			switch {
			case a == "-m" && i+1 < len(argv):
				return argv[i+1], i + 2
			case strings.HasPrefix(a, "-m") && len(a) > 2:
				return a[2:], i + 1
			case a == "-X" || a == "-W" || a == "-c":
				if a == "-c" {
					return "-c", len(argv) // inline code: no flags of ours
				}
				i += 2
			case strings.HasPrefix(a, "-"):
				i++
			default:
				return filepath.Base(a), i + 1
			}
		}
		return prog, i
	}
	return prog, i
}

// FromCmdline reads launch arguments from a process command line:
// "vllm serve MODEL --tensor-parallel-size 2 --enforce-eager",
// "python -m sglang.launch_server --model-path M --dp 2",
// "llama-server -m model.gguf -c 8192 -np 4", "mlx_lm.server --model M".
// A leading serve/server subcommand is skipped, the first positional
// argument is the model, --key=value and --key value both work, a flag
// without a value is "true", and extra words after a value extend it
// (nargs="+" flags). Keys are returned as written, without dashes; pass
// the map to Normalize. A command line with nothing to read (a
// process title set by setproctitle, multiprocessing's spawn) gives an
// empty map.
func FromCmdline(argv []string) map[string]string {
	out := map[string]string{}
	if len(argv) == 1 && strings.ContainsAny(argv[0], " \t") {
		// setproctitle and some launchers put the whole line in argv[0].
		argv = strings.Fields(argv[0])
	}
	prog, i := splitProgram(argv)
	if prog == "" || prog == "-c" || strings.Contains(prog, "::") {
		return out
	}
	if i < len(argv) && (argv[i] == "serve" || argv[i] == "server" || argv[i] == "run") {
		i++
	}
	last := "" // the key the previous value belonged to
	for ; i < len(argv); i++ {
		a := argv[i]
		if a == "--" {
			last = ""
			continue
		}
		if strings.HasPrefix(a, "-") && len(a) > 1 && !numberRE.MatchString(a) {
			key := strings.TrimLeft(a, "-")
			val := ""
			hasVal := false
			if eq := strings.IndexByte(key, '='); eq >= 0 {
				key, val, hasVal = key[:eq], key[eq+1:], true
			}
			if key == "" {
				continue
			}
			norm := NormalizeKey(key)
			if !hasVal && i+1 < len(argv) && !isBoolFlag(norm) && !isFlagWord(argv[i+1]) {
				val, hasVal = argv[i+1], true
				i++
			}
			if !hasVal {
				out[key] = "true"
				last = ""
				continue
			}
			out[key] = val
			last = key
			continue
		}
		switch {
		case last != "":
			out[last] += " " + a
		case out["model"] == "":
			out["model"] = a
		}
	}
	return out
}

// isFlagWord is true for "--x" and "-x" but not for "-1" or "-".
func isFlagWord(s string) bool {
	return strings.HasPrefix(s, "-") && len(s) > 1 && !numberRE.MatchString(s)
}
