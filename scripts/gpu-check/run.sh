#!/bin/bash
# The real-GPU check (docs/install.md, "Checked on a real GPU"). Run on an
# NVIDIA host from the folder `make gpu-check` fills; no Go needed there.
#  1. TestRealNVML: the purego NVML binding reads every GPU, through the
#     current and the old-driver calls, and agrees with go-nvml's cgo one.
#  2. heft-agent inspect, idle.
#  3. One coordinator and one agent on loopback, beside a stand-in engine
#     that holds GPU memory (engine.py: heft-sim behind a process with a
#     CUDA tensor), then a foreign process that holds memory and runs matrix
#     products on the same GPU (foreign.py). Expected: the agent names it
#     foreign, the coordinator measures the engine again with that cause,
#     and the burst under it carries the GPU's clock readings.
# Step 3's engine and foreign process need python3 with torch. Results go
# to $OUT (default ./gpu-check-out); summary.txt says what passed.
D=$(cd "$(dirname "$0")" && pwd); O=${OUT:-$PWD/gpu-check-out}; mkdir -p "$O"
W=$(mktemp -d); M=Qwen/Qwen3-8B; C=127.0.0.1:17070
trap 'kill $(jobs -p) 2>/dev/null; pkill -f "$D/heft-sim" 2>/dev/null' EXIT
{ nvidia-smi; ldconfig -p | grep -i nvidia-ml; } > "$O/smi.txt" 2>&1

# The stand-in-library tests compile C against go-nvml's header with Go's
# toolchain; `make test` runs them. Everything else in agent/gpu runs here.
HEFT_TEST_REAL_NVML=1 timeout 180 "$D/gpu.test" -test.v -test.count=1 \
	-test.skip 'TestNVMLStructLayouts|TestNVMLLibrary|TestBenchStandin' > "$O/nvml.txt" 2>&1
echo "agent/gpu tests rc=$?" >> "$O/nvml.txt"
HEFT_TEST_REAL_NVML=1 timeout 90 "$D/gpu.test" -test.run XXX -test.bench NVMLDevices \
	-test.benchmem -test.benchtime 300x >> "$O/nvml.txt" 2>&1
timeout 60 "$D/heft-agent" inspect --json > "$O/inspect-idle.json" 2>&1

at=$(head -c 48 /dev/urandom | base64 | tr -d '/+=\n'); ad=$(head -c 48 /dev/urandom | base64 | tr -d '/+=\n')
printf 'listen = "%s"\nstate_dir = "%s/cs"\nagent_token = "%s"\nadmin_token = "%s"\nprobation = "0s"\napprove_new_nodes = false\nsingle_host = true\n' \
	"$C" "$W" "$at" "$ad" > "$W/c.toml"
"$D/heft-coordinator" --config "$W/c.toml" > "$W/coordinator.log" 2>&1 &
python3 "$D/engine.py" 18000 18001 "$D/heft-sim" --model $M --log "$W/engine.log" --flavor vllm \
	--single-tps 150 --batch16-tps 2000 --prefill-tps 12000 > "$W/engine.out" 2>&1 &
sleep 3
printf 'state_dir = "%s/as"\n[coordinator]\nurl = "ws://%s/api/v1/agent"\ntoken = "%s"\n[node]\nname = "gpu-check"\n[[engine]]\nkind = "vllm"\nurl = "http://127.0.0.1:18000"\nlog = "%s/engine.log"\n' \
	"$W" "$C" "$at" "$W" > "$W/a.toml"
"$D/heft-agent" run --config "$W/a.toml" > "$W/agent.log" 2>&1 &
api() { curl -s -H "Authorization: Bearer $ad" "http://$C$1"; }
for _ in $(seq 60); do api /api/v1/models/$M/weights | grep -q '"weight"' && break; sleep 1; done
sleep 2; api /api/v1/workers > "$O/workers-before.json"
python3 "$D/foreign.py" 45 > "$W/foreign.out" 2>&1 & F=$!
sleep 12; timeout 60 "$D/heft-agent" inspect --json --engine vllm=http://127.0.0.1:18000 > "$O/inspect-load.json" 2>&1
for _ in $(seq 40); do api /api/v1/workers | grep -q foreign_gpu_process: && break; sleep 1; done
sleep 2; api /api/v1/workers > "$O/workers-after.json"
wait $F
{ for f in coordinator.log engine.out agent.log foreign.out; do echo "=== $f"; tail -c 20000 "$W/$f"; done; } > "$O/logs.txt"
python3 "$D/summary.py" "$O" > "$O/summary.txt"; rc=$?
cat "$O/summary.txt"
exit $rc
