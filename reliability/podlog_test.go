package reliability

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"heft/agent/collect"
	"heft/agent/engine"
	"heft/agent/logsource"
	"heft/agent/logwrap/wraptest"
	"heft/shared/testutil"
	"heft/shared/wire"
)

// An engine in a Kubernetes pod, its log followed through the node's pod
// logs while the kubelet rotates it (the rotated file ending inside a
// split line), the container restarts (1.log) and the pod is re-created
// (a new UID): after each, the pools in the snapshot are the new run's,
// and the capacity key stays while the launch arguments do.
func TestPoolsFollowPodLog(t *testing.T) {
	dir := t.TempDir()
	rawPath := filepath.Join(dir, "vllm.log")
	s, original := startUnevenVLLM(t, rawPath)
	lines := func(pools ...int64) []string {
		return strings.Split(strings.TrimRight(withPools(t, original, pools...), "\n"), "\n")
	}
	root := filepath.Join(dir, "pods")
	podDir := func(uid string) string { return filepath.Join(root, "inference_vllm-0_"+uid, "vllm") }
	write := func(path, content string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		writeFile(t, path, content)
	}
	stamp := time.Now().Add(-time.Hour)
	cri := func(ls []string) string {
		stamp = stamp.Add(time.Minute)
		return wraptest.CRI(ls, stamp, 64)
	}
	uid1 := "11111111-2222-3333-4444-555555555555"
	write(filepath.Join(podDir(uid1), "0.log"), cri(lines(24094, 2925)))

	col, err := collect.New(collect.Config{Node: "pod-node", Engines: []engine.Config{{Kind: "vllm", URL: s.URL(), Log: "k8s:inference/vllm-0/vllm"}},
		LogOptions: logsource.Options{PodsRoot: root, Poll: 50 * time.Millisecond, Rescan: 100 * time.Millisecond}},
		noGPUs{}, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	col.Start(ctx)
	defer func() { cancel(); col.Wait() }()

	var lastKey string
	expectPools := func(t *testing.T, what string, want ...int64) {
		t.Helper()
		var e wire.Engine
		testutil.Eventually(t, fmt.Sprintf("%s: pools %v", what, want), 15*time.Second, func() bool {
			e = col.Snapshot(ctx).Engines[0]
			return slices.EqualFunc(e.Ranks, want, func(r wire.Rank, w int64) bool { return r.KVTokens == w }) &&
				e.Complete != nil && *e.Complete
		})
		if e.CapacityKey == "" || (lastKey != "" && e.CapacityKey != lastKey) {
			t.Fatalf("%s: capacity key %q changed from %q, though the launch arguments did not", what, e.CapacityKey, lastKey)
		}
		if e.LogSource == nil || e.LogSource.Wrapper != "cri" || e.LogSource.Error != "" {
			t.Fatalf("%s: log source %+v", what, e.LogSource)
		}
		lastKey = e.CapacityKey
	}
	expectPools(t, "the pod's first run", 24094, 2925)

	t.Run("kubelet rotation inside a split line", func(t *testing.T) {
		// The same run goes on: a later start-up printed into the rotated
		// file's successor, its first pool line's "P" chunks before the
		// rotation and its "F" after.
		text := cri(lines(20000, 20000))
		cut := strings.Index(text, "GPU KV cache size")
		cut = strings.LastIndex(text[:cut], "\n") + 1 // the chunk holding it starts the new file
		before := strings.Split(strings.TrimSuffix(text[:cut], "\n"), "\n")
		if !strings.Contains(before[len(before)-1], " P ") {
			t.Fatalf("the rotated file does not end inside the split pool line: %q", before[len(before)-1])
		}
		live := filepath.Join(podDir(uid1), "0.log")
		f, err := os.OpenFile(live, os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteString(text[:cut]); err != nil {
			t.Fatal(err)
		}
		f.Close()
		if err := os.Rename(live, live+"."+time.Now().UTC().Format("20060102-150405")); err != nil {
			t.Fatal(err)
		}
		write(live, text[cut:])
		expectPools(t, "after the kubelet rotated the log", 20000, 20000)
	})
	t.Run("container restart", func(t *testing.T) {
		write(filepath.Join(podDir(uid1), "1.log"), cri(lines(9000, 9000)))
		expectPools(t, "after the container restarted", 9000, 9000)
	})
	t.Run("pod re-created", func(t *testing.T) {
		uid2 := "66666666-7777-8888-9999-000000000000"
		write(filepath.Join(podDir(uid2), "0.log"), cri(lines(30000, 15000)))
		if err := os.RemoveAll(filepath.Dir(podDir(uid1))); err != nil {
			t.Fatal(err)
		}
		expectPools(t, "after the pod was re-created", 30000, 15000)
	})
}
