"""Kernel-time table of one steady-state step of the PyTorch baseline (torch.profiler), to set
beside mxtrain's (ncu) when looking for where the time goes. Not a benchmark: profiling adds
overhead; use bench/vs_torch.sh for throughput.
Usage: python3 bench/profile_torch.py gpt2|llama [compile] > table.txt"""
import sys, os, torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_baseline as tb
from torch.profiler import profile, ProfilerActivity

which = sys.argv[1]
compile_ = len(sys.argv) > 2 and sys.argv[2] == "compile"
if which == "gpt2":
    args = dict(arch="gpt2", vocab=50304, d=768, L=12, h=12); B, T = 64, 1024
else:
    args = dict(arch="llama", vocab=32000, d=2048, L=22, h=32, kv=4, ffn=5632); B, T = 8, 2048
m = tb.LM(T=T, **args).to("cuda")
opt = torch.optim.AdamW(m.parameters(), lr=1e-4, fused=True)
fwd = torch.compile(m) if compile_ else m
idx = torch.randint(0, args["vocab"], (B, T), device="cuda"); tgt = torch.randint(0, args["vocab"], (B, T), device="cuda")
def step():
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = fwd(idx, tgt)
    loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
for _ in range(4): step()
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    step(); torch.cuda.synchronize()
rows = {}
for e in prof.events():
    if e.device_type == torch.autograd.DeviceType.CUDA:
        r = rows.setdefault(e.name, [0, 0.0]); r[0] += 1; r[1] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
total = sum(r[1] for r in rows.values())
print(f"# {which} compile={compile_} B={B} T={T}: kernel time {total/1e3:.2f} ms in {sum(r[0] for r in rows.values())} kernels")
for name, (n, us) in sorted(rows.items(), key=lambda kv: -kv[1][1]):
    print(f"{us/1e3:9.3f} ms {n:5d}x  {name[:160]}")
