# Reads run.sh's results and prints one line per check: PASS or FAIL, why.
import json, os, re, sys

out = sys.argv[1]
failed = 0


def check(name, ok, detail):
    global failed
    failed += not ok
    print(("PASS " if ok else "FAIL ") + name + ": " + detail)


def load(name):
    try:
        with open(os.path.join(out, name)) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        return {"error": str(e)}


nvml = open(os.path.join(out, "nvml.txt")).read()
check("TestRealNVML", "--- PASS: TestRealNVML" in nvml, "purego binding against go-nvml on this driver")
check("agent/gpu tests", "agent/gpu tests rc=0" in nvml, "mock-driven mapping tests with -race")
real = re.search(r"BenchmarkRealNVMLDevices\S*\s+\d+\s+(\d+) ns/op", nvml)
check("one read of every GPU", bool(real), real and "%.1f ms" % (int(real.group(1)) / 1e6) or "no benchmark line")

idle = load("inspect-idle.json")
gpus = idle.get("gpus") or []
check("inspect sees the GPUs", bool(gpus) and not idle.get("gpu_error"),
      ", ".join("%s %d MiB" % (g.get("name"), g.get("memory_total_bytes", 0) >> 20) for g in gpus) or idle.get("gpu_error", "none"))

busy = load("inspect-load.json")
eng = (busy.get("engines") or [{}])[0]
check("the engine's GPUs found by its process tree", bool(eng.get("gpu_uuids")), "pid %s on %s" % (eng.get("pid"), eng.get("gpu_uuids")))
check("a foreign process named", bool(eng.get("foreign_processes")),
      str([(p["pid"], p.get("used_memory_bytes", 0) >> 20) for p in eng.get("foreign_processes") or []]) + " (pid, MiB)")

w = (load("workers-after.json").get("workers") or [{}])[0]
hist = w.get("history") or []
causes = [h.get("cause", "") for h in hist]
check("measured again for it", any(c.startswith("foreign_gpu_process") for c in causes), "history triggers " + str([h.get("trigger") for h in hist]))
m = w.get("measurement") or {}
check("the burst carries the GPU's clocks", m.get("sm_clock_median_mhz", 0) > 0,
      "SM median %s MHz of %s, reasons %s" % (m.get("sm_clock_median_mhz"), (w.get("gpus") or [{}])[0].get("sm_clock_max_mhz"), m.get("clock_event_reasons")))
print("warnings:", [x.get("code") for x in w.get("warnings") or []])
sys.exit(1 if failed else 0)
