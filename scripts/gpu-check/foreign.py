# A foreign process on the GPU: holds 4 GiB and runs bf16 matrix products.
import sys, time, torch
secs = float(sys.argv[1])
hold = torch.ones(1 << 30, device="cuda")
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end = time.time() + secs
n = 0
while time.time() < end:
    for _ in range(20):
        a @ a
    torch.cuda.synchronize()
    n += 20
print("foreign load done:", n, "products", flush=True)
