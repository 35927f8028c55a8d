package sim

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

// writeStartLog writes the flavour's start-up lines, in the engines' own
// formats (see reference/engines.md), to the configured log file.
func (s *Server) writeStartLog(now time.Time) error {
	f, err := os.OpenFile(s.cfg.LogPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	switch s.cfg.Flavor {
	case FlavorVLLM:
		s.vllmLog(w, now)
	case FlavorSGLang:
		s.sglangLog(w, now)
	case FlavorMLX:
		s.mlxLog(w, now)
	case FlavorLlamaCpp:
		s.llamaLog(w, now)
	case FlavorOllama:
		s.ollamaLog(w, now)
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// loggedPools are the pools the start-up log prints: the ranks' own, or
// the fault's.
func (s *Server) loggedPools() []int64 {
	if len(s.cfg.Faults.LogKVTokens) > 0 {
		return s.cfg.Faults.LogKVTokens
	}
	return s.cfg.KVTokens
}

func (s *Server) vllmLog(w *bufio.Writer, now time.Time) {
	ts := now.Format("01-02 15:04:05")
	api := fmt.Sprintf("(APIServer pid=%d) ", s.pid)
	info := func(prefix, file string, line int, format string, args ...any) {
		fmt.Fprintf(w, "%sINFO %s [%s:%d] %s\n", prefix, ts, file, line, fmt.Sprintf(format, args...))
	}
	// One engine core process per DP rank; its name carries the rank only
	// when there is more than one (naming.go).
	core := s.vllmCore
	c := s.cfg
	info(api, "api_server.py", 1839, "vLLM API server version %s", c.Version)
	info(api, "utils.py", 253, "non-default args: %s", pyDict(s.vllmArgs()))
	info(api, "model.py", 631, "Resolved architecture: Qwen3ForCausalLM")
	info(api, "model.py", 1745, "Using max model len %d", c.MaxModelLen)
	info(api, "scheduler.py", 216, "Chunked prefill is enabled with max_num_batched_tokens=%d.", c.MaxBatchedTokens)
	for i := range c.DP {
		info(core(i), "core.py", 93, "Initializing a V1 LLM engine (v%s) with config: model=%s, tokenizer=%s, "+
			"dtype=torch.bfloat16, max_seq_len=%d, tensor_parallel_size=1, pipeline_parallel_size=1, "+
			"served_model_name=%s, enable_prefix_caching=%s, enable_chunked_prefill=True",
			c.Version, pyStr(c.Model), pyStr(c.Model), c.MaxModelLen, c.Model, pyRepr(!c.NoPrefixCache))
	}
	for i := range c.DP {
		info(core(i), "gpu_model_runner.py", 3467, "Starting to load model %s...", c.Model)
	}
	for i := range c.DP {
		info(core(i), "gpu_model_runner.py", 3549, "Model loading took %.2f GiB memory and %.6f seconds", 15.27, 7.084112)
	}
	for i, pool := range s.loggedPools() {
		info(core(i), "gpu_worker.py", 359, "Available KV cache memory: %.2f GiB", kvGiB(pool))
		info(core(i), "kv_cache_utils.py", 1286, "GPU KV cache size: %s tokens", thousands(pool))
		info(core(i), "kv_cache_utils.py", 1291, "Maximum concurrency for %s tokens per request: %.2fx",
			thousands(c.MaxModelLen), float64(pool)/float64(c.MaxModelLen))
	}
	for i := range c.DP {
		info(core(i), "core.py", 259, "init engine (profile, create kv cache, warmup model) took %.2f seconds", 29.85)
	}
	info(api, "api_server.py", 1099, "Supported tasks: ['generate']")
	info(api, "api_server.py", 1941, "Starting vLLM API server 0 on %s", s.url)
	info(api, "launcher.py", 44, "Available routes are:")
	for _, route := range []string{"/health GET", "/metrics GET", "/version GET", "/tokenize POST", "/v1/models GET", "/v1/chat/completions POST"} {
		path, method, _ := strings.Cut(route, " ")
		info(api, "launcher.py", 52, "Route: %s, Methods: %s", path, method)
	}
	fmt.Fprintf(w, "%sINFO:     Started server process [%d]\n", api, s.pid)
	fmt.Fprintf(w, "%sINFO:     Waiting for application startup.\n", api)
	fmt.Fprintf(w, "%sINFO:     Application startup complete.\n", api)
}

func (s *Server) sglangLog(w *bufio.Writer, now time.Time) {
	ts := now.Format("2006-01-02 15:04:05")
	line := func(rank int, format string, args ...any) {
		fmt.Fprintf(w, "[%s%s] %s\n", ts, s.sglangTag(rank), fmt.Sprintf(format, args...))
	}
	c := s.cfg
	if c.LogNaming == NamingRouter {
		// The router's launch command, then one server per worker.
		fmt.Fprintf(w, "python -m sglang_router.launch_server --model-path %s --dp %d --port %d\n", c.Model, c.DP, s.port)
		for i := range c.DP {
			line(-1, "server_args=%s", pyDataclass("ServerArgs", s.sglangRouterWorkerArgs(i)))
		}
	} else {
		line(-1, "server_args=%s", pyDataclass("ServerArgs", s.sglangArgs()))
	}
	for i := range c.DP {
		line(i, "Init torch distributed begin.")
	}
	for i, pool := range s.loggedPools() {
		pre, _ := sglangMem(pool)
		line(i, "Load weight begin. avail mem=%.2f GB", pre)
	}
	for i, pool := range s.loggedPools() {
		_, post := sglangMem(pool)
		line(i, "Load weight end. type=Qwen3ForCausalLM, dtype=torch.bfloat16, avail mem=%.2f GB, mem usage=%.2f GB.", post, weightsGiB)
	}
	for i, pool := range s.loggedPools() {
		if !s.sglangPrintsPool(i) {
			continue
		}
		_, post := sglangMem(pool)
		kv := kvGiB(pool)
		line(i, "KV Cache is allocated. #tokens: %d, K size: %.2f GB, V size: %.2f GB", pool, kv/2, kv/2)
		line(i, "Memory pool end. avail mem=%.2f GB", post-kv)
	}
	for i, pool := range s.loggedPools() {
		if !s.sglangPrintsPool(i) {
			continue
		}
		_, post := sglangMem(pool)
		line(i, "max_total_num_tokens=%d, chunked_prefill_size=%d, max_prefill_tokens=16384, "+
			"max_running_requests=%d, context_len=%d, available_gpu_mem=%.2f GB",
			pool, c.MaxBatchedTokens, c.MaxRunning, c.MaxModelLen, post-kvGiB(pool)-0.55)
	}
	line(-1, "INFO:     Started server process [%d]", s.pid)
	line(-1, "INFO:     Waiting for application startup.")
	line(-1, "INFO:     Application startup complete.")
	line(-1, "INFO:     Uvicorn running on %s (Press CTRL+C to quit)", s.url)
	line(-1, "The server is fired up and ready to roll!")
}

func (s *Server) mlxLog(w *bufio.Writer, now time.Time) {
	fmt.Fprintf(w, "/opt/homebrew/lib/python3.12/site-packages/mlx_lm/server.py:1187: UserWarning: "+
		"mlx_lm.server is not recommended for production as it only implements basic security checks.\n  warnings.warn(\n")
	fmt.Fprintf(w, "%s,%03d - INFO - Starting httpd at %s on port %d...\n",
		now.Format("2006-01-02 15:04:05"), now.Nanosecond()/1e6, s.host, s.port)
}

// llamaLog prints llama-server's start-up as it runs with "-np N" and no
// --kv-unified: a split cache, one stream of n_ctx/N cells per slot. Its
// cache line names one stream's cells beside "N/N seqs", N the streams
// (src/llama-kv-cache.cpp prints kv_size, n_seq_max and n_stream), so the
// pool is cells × N; n_ctx is that whole, rounded down to a multiple of the
// slots as llama.cpp rounds it.
func (s *Server) llamaLog(w *bufio.Writer, _ time.Time) {
	c := s.cfg
	slots := int64(c.MaxRunning)
	perSlot := c.KVTokens[0] / slots
	pool := perSlot * slots
	build := strings.TrimPrefix(c.Version, "b")
	kvMiB := float64(pool) * kvBytesPerToken / (1 << 20)
	fmt.Fprintf(w, "build: %s (5f1d2e3a) with cc (Ubuntu 13.3.0-6ubuntu2~24.04) 13.3.0 for x86_64-linux-gnu\n", build)
	fmt.Fprintf(w, "main: HTTP server is listening, hostname: %s, port: %d, http threads: 15\n", s.host, s.port)
	fmt.Fprintf(w, "main: loading model\n")
	fmt.Fprintf(w, "llama_context: constructing llama_context\n")
	fmt.Fprintf(w, "llama_context: n_seq_max     = %d\n", slots)
	fmt.Fprintf(w, "llama_context: n_ctx         = %d\n", pool)
	fmt.Fprintf(w, "llama_context: n_ctx_seq     = %d\n", perSlot)
	fmt.Fprintf(w, "llama_context: n_batch       = %d\n", c.MaxBatchedTokens)
	fmt.Fprintf(w, "llama_context: kv_unified    = false\n")
	fmt.Fprintf(w, "llama_kv_cache:      CUDA0 KV buffer size = %8.2f MiB\n", kvMiB)
	fmt.Fprintf(w, "llama_kv_cache: size = %7.2f MiB (%6d cells, %3d layers, %2d/%d seqs), K (%s): %7.2f MiB, V (%s): %7.2f MiB\n",
		kvMiB, perSlot, 36, slots, slots, "f16", kvMiB/2, "f16", kvMiB/2)
	for i := range slots {
		fmt.Fprintf(w, "slot   load_model: id %2d | task -1 | new slot, n_ctx = %d\n", i, perSlot)
	}
	fmt.Fprintf(w, "main: model loaded\n")
	fmt.Fprintf(w, "main: server is listening on %s - starting the main loop\n", s.url)
	fmt.Fprintf(w, "srv  update_slots: all slots are idle\n")
}

func (s *Server) ollamaLog(w *bufio.Writer, now time.Time) {
	ts := now.Format("2006-01-02T15:04:05.000Z07:00")
	c := s.cfg
	fmt.Fprintf(w, "time=%s level=INFO source=routes.go:1544 msg=\"server config\" env=\"map[OLLAMA_CONTEXT_LENGTH:%d OLLAMA_HOST:%s OLLAMA_NUM_PARALLEL:%d]\"\n",
		ts, c.KVTokens[0], s.url, c.MaxRunning)
	fmt.Fprintf(w, "time=%s level=INFO source=images.go:522 msg=\"total blobs: 5\"\n", ts)
	fmt.Fprintf(w, "time=%s level=INFO source=routes.go:1597 msg=\"Listening on %s (version %s)\"\n", ts, net.JoinHostPort(s.host, strconv.Itoa(s.port)), c.Version)
}

// thousands formats 24094 as "24,094", as vLLM prints pool sizes
// ("{:,}" in Python). Pool sizes are never negative.
func thousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	var b strings.Builder
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
