# A stand-in engine that holds GPU memory: it allocates a tensor on the GPU
# (as vLLM's engine core would), starts heft-sim as its child on an inner
# port, and forwards the outer port to it. The agent finds this process by
# its port; its tree holds the memory, so the engine's GPU set is real.
import http.client, http.server, os, subprocess, sys, signal
outer, inner, sim = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
try:
    import torch
    hold = torch.ones(1 << 30, device="cuda")  # 4 GiB of float32
    print("holding", hold.numel() * 4 >> 20, "MiB on", torch.cuda.get_device_name(0), flush=True)
except Exception as e:
    print("no GPU memory held:", e, flush=True)
child = subprocess.Popen(sim + ["--listen", "127.0.0.1:%d" % inner])
signal.signal(signal.SIGTERM, lambda *a: (child.terminate(), os._exit(0)))

class H(http.server.BaseHTTPRequestHandler):
    def fwd(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else None
        c = http.client.HTTPConnection("127.0.0.1", inner, timeout=600)
        hdr = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
        c.request(self.command, self.path, body=body, headers=hdr)
        r = c.getresponse()
        self.send_response(r.status)
        for k, v in r.getheaders():
            if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(k, v)
        self.send_header("Connection", "close")
        self.end_headers()
        while True:
            b = r.read1(65536)
            if not b:
                break
            self.wfile.write(b)
            self.wfile.flush()
        c.close()
    do_GET = do_POST = fwd
    def log_message(self, *a):
        pass

http.server.ThreadingHTTPServer(("127.0.0.1", outer), H).serve_forever()
