package engine

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"heft/agent/engine/launch"
	"heft/agent/engine/proc"
	"heft/shared/wire"
)

// TestFactsFindsEngineProcess runs a fake SGLang-free vLLM in another
// process with a real command line and checks everything that depends on
// the process: pid, launch args from the command line, the capacity key,
// the engine's GPUs and the foreign processes on them.
func TestFactsFindsEngineProcess(t *testing.T) {
	argv := []string{"vllm", "serve", "Qwen/Qwen3-8B", "--data-parallel-size", "2", "--api-key", "sk-secret", "--port", "8001"}
	ch := startChild(t, "parent:vllm", argv)
	engineRoot := ch.Cmd.Process.Pid
	listener, err := proc.FindListener(t.Context(), ch.Port)
	if err != nil {
		t.Fatal(err)
	}
	gpus := []wire.GPU{
		{Index: 0, UUID: "GPU-aaaa", Processes: []wire.GPUProcess{
			{PID: listener, Name: "python3", UsedMemory: 20 << 30},
			{PID: 4_000_001, Name: "other-team", UsedMemory: 3 << 30},
			{PID: engineRoot, Name: "vllm", UsedMemory: 1 << 30},
		}},
		{Index: 1, UUID: "GPU-bbbb", Processes: []wire.GPUProcess{{PID: 4_000_002, Name: "not-ours", UsedMemory: 1 << 30}}},
	}
	c := newClient(t, "vllm", fmt.Sprintf("http://127.0.0.1:%d", ch.Port), nil)
	e := c.Facts(t.Context(), gpus, nil)
	checkWire(t, e)
	if e.Error != "" {
		t.Fatal(e.Error)
	}
	if e.PID != engineRoot {
		t.Errorf("pid %d, want the engine root %d", e.PID, engineRoot)
	}
	wantArgs := []string{"data_parallel_size=2", "model=Qwen/Qwen3-8B", "port=8001"}
	if e.LaunchArgsSource != SourceCmdline || !reflect.DeepEqual(e.LaunchArgs, wantArgs) {
		t.Errorf("launch args %q from %q, want %q from the command line", e.LaunchArgs, e.LaunchArgsSource, wantArgs)
	}
	if e.CapacityKey != launch.CapacityKey("gpu-a", "vllm", "Qwen/Qwen3-8B", wantArgs) {
		t.Errorf("capacity key %q", e.CapacityKey)
	}
	if !reflect.DeepEqual(e.GPUUUIDs, []string{"GPU-aaaa"}) {
		t.Errorf("gpus %v", e.GPUUUIDs)
	}
	wantForeign := []wire.GPUProcess{{PID: 4_000_001, Name: "other-team", UsedMemory: 3 << 30, Foreign: true}}
	if !reflect.DeepEqual(e.ForeignProcesses, wantForeign) {
		t.Errorf("foreign %+v", e.ForeignProcesses)
	}
	// What the engine holds is its whole tree's memory, on its GPUs only.
	if want := []wire.GPUMemory{{UUID: "GPU-aaaa", UsedBytes: 21 << 30}}; !reflect.DeepEqual(e.GPUMemory, want) {
		t.Errorf("gpu memory %+v, want %+v", e.GPUMemory, want)
	}
	if gpus[0].Processes[1].Foreign {
		t.Error("Facts changed its input")
	}

	// A second read finds the same process again (through the cached pid).
	if again := c.Facts(t.Context(), gpus, nil); again.PID != engineRoot || again.CapacityKey != e.CapacityKey {
		t.Errorf("second read: pid %d key %q", again.PID, again.CapacityKey)
	}

	// The engine goes away. Its log still has launch args, but the key
	// keeps the command line's through the outage.
	ch.Stop()
	down := c.Facts(t.Context(), gpus, readLog(t, "vllm", "engines/vllm-dp2.log"))
	checkWire(t, down)
	if down.Ready || !strings.Contains(down.Error, "connection refused") || down.PID != 0 {
		t.Errorf("after stop: ready %v error %q pid %d", down.Ready, down.Error, down.PID)
	}
	if down.LaunchArgsSource != SourceCmdline || down.CapacityKey != e.CapacityKey {
		t.Errorf("after stop: args from %q, key %q; want the command line's key %q", down.LaunchArgsSource, down.CapacityKey, e.CapacityKey)
	}
	if len(down.GPUUUIDs) != 0 || len(down.ForeignProcesses) != 0 || len(down.GPUMemory) != 0 {
		t.Errorf("after stop: gpus %v foreign %v memory %v", down.GPUUUIDs, down.ForeignProcesses, down.GPUMemory)
	}
}

// A port forwarder (docker-proxy) listening for a containerised engine
// must not lend its own flags as the engine's launch arguments.
func TestFactsIgnoresForwarderCmdline(t *testing.T) {
	ch := startChild(t, "serve:vllm", []string{"docker-proxy", "-proto", "tcp", "-host-ip", "0.0.0.0", "-host-port", "8000",
		"-container-ip", "172.17.0.2", "-container-port", "8000"})
	lf := readLog(t, "vllm", "engines/vllm-dp2.log")
	e := newClient(t, "vllm", fmt.Sprintf("http://127.0.0.1:%d", ch.Port), nil).Facts(t.Context(), nil, lf)
	checkWire(t, e)
	if e.PID != ch.Cmd.Process.Pid {
		t.Errorf("pid %d, want the listener %d", e.PID, ch.Cmd.Process.Pid)
	}
	if e.LaunchArgsSource != SourceLog || slices.ContainsFunc(e.LaunchArgs, func(a string) bool { return strings.Contains(a, "container") }) {
		t.Errorf("launch args %q from %q, want the log's", e.LaunchArgs, e.LaunchArgsSource)
	}
}
