package sim

import (
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

func gibBytes(g float64) int64 { return int64(g * gib) }

func round2(x float64) float64 { return math.Round(x*100) / 100 }

// handleServerInfo is SGLang's /server_info: the server args at the top
// level, max_total_num_tokens of DP0 only, and one internal state per rank
// (which, like the real one, does not say which rank it is).
func (s *Server) handleServerInfo(w http.ResponseWriter, _ *http.Request) {
	views := s.views()
	info := jsonArgs(s.sglangArgs())
	info["max_total_num_tokens"] = views[0].pool
	info["max_req_input_len"] = min(views[0].pool, s.cfg.MaxModelLen) - 1
	states := make([]any, len(views))
	for i, v := range views {
		states[i] = map[string]any{
			"last_gen_throughput": v.gauges.throughput,
			"memory_usage": map[string]any{
				"weight": weightsGiB, "kvcache": round2(kvGiB(v.pool)),
				"token_capacity": v.pool, "graph": 0.55,
			},
			"effective_max_running_requests_per_dp": s.cfg.MaxRunning,
		}
	}
	info["internal_states"] = states
	info["version"] = s.cfg.Version
	writeJSON(w, http.StatusOK, info)
}

func (s *Server) handleModelInfo(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{
		"model_path": s.cfg.Model, "tokenizer_path": s.cfg.Model, "is_generation": true,
		"preferred_sampling_params": nil, "weight_version": "default",
		"has_image_understanding": false, "has_audio_understanding": false, "model_type": "qwen3",
		"architectures": []string{"Qwen3ForCausalLM"},
	})
}

// handleLoads is SGLang's /v1/loads, optionally for one ?dp_rank=N. Its
// requests and tokens are the scheduler's as they are now
// (SchedulerLoadInquirer.get_loads); its gen_throughput is the gauge's.
func (s *Server) handleLoads(w http.ResponseWriter, r *http.Request) {
	only := -1
	if q := r.URL.Query().Get("dp_rank"); q != "" {
		n, err := strconv.Atoi(q)
		if err != nil || n < 0 || n >= len(s.ranks) {
			writeJSON(w, http.StatusBadRequest, map[string]any{"error": fmt.Sprintf("dp_rank %q is not a rank of this server (0..%d)", q, len(s.ranks)-1)})
			return
		}
		only = n
	}
	loads := []any{}
	now := float64(time.Now().UnixMilli()) / 1000
	for _, v := range s.views() {
		if only >= 0 && v.idx != only {
			continue
		}
		loads = append(loads, map[string]any{
			"dp_rank": v.idx, "timestamp": now,
			"num_running_reqs": v.running, "num_waiting_reqs": v.waiting,
			"num_used_tokens": v.used, "num_total_tokens": v.used + v.pending,
			"max_total_num_tokens": v.pool, "token_usage": float64(v.used) / float64(v.pool),
			"gen_throughput": v.gauges.throughput, "cache_hit_rate": hitRate(v),
			"utilization":          float64(v.running) / float64(s.cfg.MaxRunning),
			"max_running_requests": s.cfg.MaxRunning,
			"memory": map[string]any{
				"weight_gb": weightsGiB, "kv_cache_gb": round2(kvGiB(v.pool)), "graph_gb": 0.55,
				"token_capacity": v.pool,
			},
		})
	}
	writeJSON(w, http.StatusOK, map[string]any{"loads": loads})
}

func (s *Server) llamaSlotCtx() int64 { return s.cfg.seqLimit(s.ranks[0].pool) }

func (s *Server) llamaParams() map[string]any {
	return map[string]any{"n_predict": -1, "temperature": 0.8, "top_k": 40, "top_p": 0.95, "ignore_eos": false, "stream": true}
}

// handleProps is llama-server's /props: n_ctx is per slot.
func (s *Server) handleProps(w http.ResponseWriter, _ *http.Request) {
	build := strings.TrimPrefix(s.cfg.Version, "b")
	writeJSON(w, http.StatusOK, map[string]any{
		"default_generation_settings": map[string]any{
			"id": 0, "id_task": -1, "n_ctx": s.llamaSlotCtx(), "speculative": false,
			"is_processing": false, "params": s.llamaParams(),
		},
		"total_slots":      s.cfg.MaxRunning,
		"model_alias":      s.cfg.Model,
		"model_path":       "/models/" + strings.ReplaceAll(s.cfg.Model, "/", "_") + ".gguf",
		"modalities":       map[string]bool{"vision": false, "audio": false},
		"endpoint_slots":   true,
		"endpoint_props":   false,
		"endpoint_metrics": true,
		"chat_template":    "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor %}",
		"bos_token":        "",
		"eos_token":        "<|im_end|>",
		"build_info":       "b" + build + "-5f1d2e3a",
	})
}

// handleSlots is llama-server's /slots: one entry per slot, the running
// sequences filling the first slots in admission order.
func (s *Server) handleSlots(w http.ResponseWriter, _ *http.Request) {
	v := s.ranks[0].view()
	nctx := s.llamaSlotCtx()
	slots := make([]any, v.maxSlots)
	for i := range slots {
		slot := map[string]any{
			"id": i, "n_ctx": nctx, "speculative": false, "is_processing": false, "id_task": -1,
			"params":     s.llamaParams(),
			"next_token": []any{map[string]any{"has_next_token": false, "has_new_line": false, "n_remain": -1, "n_decoded": 0}},
		}
		if i < len(v.seqs) {
			q := v.seqs[i]
			slot["is_processing"], slot["id_task"] = true, q.id
			slot["next_token"] = []any{map[string]any{
				"has_next_token": true, "has_new_line": false, "n_remain": q.target - q.gen, "n_decoded": q.gen,
			}}
		}
		slots[i] = slot
	}
	writeJSON(w, http.StatusOK, slots)
}

func (s *Server) ollamaModel() map[string]any {
	size := gibBytes(weightsGiB) + gibBytes(kvGiB(s.ranks[0].pool))
	return map[string]any{
		"name": s.cfg.Model, "model": s.cfg.Model, "size": size,
		"digest": "500a1f067a9f782620b40bee6f7b0c89e17ae61f686b92c24933e4ca4b2b8b41",
		"details": map[string]any{
			"parent_model": "", "format": "gguf", "family": "qwen3", "families": []string{"qwen3"},
			"parameter_size": "8.2B", "quantization_level": "Q4_K_M",
		},
	}
}

// handleOllamaPS is Ollama's /api/ps: context_length is the pool.
func (s *Server) handleOllamaPS(w http.ResponseWriter, _ *http.Request) {
	m := s.ollamaModel()
	m["expires_at"] = time.Now().Add(5 * time.Minute).Format(time.RFC3339Nano)
	m["size_vram"] = m["size"]
	m["context_length"] = s.ranks[0].pool
	writeJSON(w, http.StatusOK, map[string]any{"models": []any{m}})
}

func (s *Server) handleOllamaTags(w http.ResponseWriter, _ *http.Request) {
	m := s.ollamaModel()
	m["modified_at"] = s.start.Format(time.RFC3339Nano)
	m["size"] = gibBytes(weightsGiB)
	writeJSON(w, http.StatusOK, map[string]any{"models": []any{m}})
}
