package fleet

import (
	"slices"
	"strconv"

	"heft/shared/wire"
)

// What a node says of its GPUs is bounded by the GPUs it reports: a GPU
// listed twice in a snapshot is one GPU, an engine's gpu_uuids keep only
// GPUs the node reports (each once), and a GPU several of a node's engines
// list is shown in full on one worker only. Otherwise a node whose every
// engine lists every GPU makes each worker's view carry the whole host:
// 64 engines × 64 GPUs of process lists is a view of tens of megabytes,
// sent to every dashboard and heft-sync.

// briefBytes is how much of a string a GPU's brief form keeps.
const briefBytes = 64

// distinctGPUs returns gpus with each UUID (or, without one, index) once,
// the first kept.
func distinctGPUs(gpus []wire.GPU) []wire.GPU {
	seen := make(map[string]bool, len(gpus))
	out := make([]wire.GPU, 0, len(gpus))
	for _, g := range gpus {
		if id := gpuID(g); !seen[id] {
			seen[id] = true
			out = append(out, g)
		}
	}
	return out
}

func gpuID(g wire.GPU) string {
	if g.UUID != "" {
		return "uuid " + g.UUID
	}
	return "index " + strconv.Itoa(g.Index)
}

// reportedUUIDs returns the UUIDs of list the node reports a GPU for,
// each once, in list's order.
func reportedUUIDs(list []string, gpus []wire.GPU) []string {
	if len(list) == 0 {
		return list
	}
	var out []string
	for _, u := range list {
		if !slices.Contains(out, u) && slices.ContainsFunc(gpus, func(g wire.GPU) bool { return g.UUID == u }) {
			out = append(out, u)
		}
	}
	return out
}

// showGPUs sets what each of a node's workers shows of its GPUs: the
// first worker (by capacity key) to list a GPU shows it whole, the others
// its brief form.
func showGPUs(n *node) {
	shown := map[string]bool{}
	for _, w := range sortedWorkers(n.workers) {
		w.shownGPUs = nil
		for _, g := range w.gpus {
			id := gpuID(g)
			if shown[id] {
				g = brief(g)
			}
			shown[id] = true
			w.shownGPUs = append(w.shownGPUs, g)
		}
	}
}

// brief is a GPU without its lists (processes, clock reasons,
// unsupported fields) and with its strings clipped: what a worker shows
// of a GPU another worker of its node shows whole.
func brief(g wire.GPU) wire.GPU {
	g.Processes, g.ClockEventReasons, g.Unsupported = nil, nil, nil
	g.UUID, g.Name, g.Error = wire.Clip(g.UUID, briefBytes), wire.Clip(g.Name, briefBytes), wire.Clip(g.Error, briefBytes)
	return g
}
