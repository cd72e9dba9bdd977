# PyTorch's FP8 baseline of docs/benchmarking.md (the protocol): kept in the repository so that it travels
# to the GPU machine with it.
"""PyTorch FP8 training anchor: Linear layers through torch._scaled_mm with per-tensor current scaling
(E4M3 forward, E5M2 gradients), like torchao's tensorwise float8 training, under torch.compile.
Prints JSON lines. Usage: python3 torch_fp8.py [all|1b|3b]"""
import json, sys, time, torch, torch.nn as nn, torch.nn.functional as F
sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.abspath(__file__))); import torch_baseline as tb

E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2
def q(t, dt):
    amax = t.abs().max().float().clamp(min=1e-12)
    s = torch.finfo(dt).max / amax
    return (t.float() * s).to(dt), (1.0 / s)

class FP8MM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        x2 = x.reshape(-1, x.shape[-1])
        xq, xs = q(x2, E4); wq, ws = q(w, E4)
        y = torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws, out_dtype=torch.bfloat16)
        ctx.save_for_backward(xq, xs, wq, ws); ctx.shape = x.shape
        return y.view(*x.shape[:-1], w.shape[0])
    @staticmethod
    def backward(ctx, g):
        xq, xs, wq, ws = ctx.saved_tensors
        g2 = g.reshape(-1, g.shape[-1]); gq, gs = q(g2, E5)
        dx = torch._scaled_mm(gq, wq.t().contiguous().t(), scale_a=gs, scale_b=ws, out_dtype=torch.bfloat16)
        dw = torch._scaled_mm(gq.t().contiguous(), xq.t().contiguous().t(), scale_a=gs, scale_b=xs, out_dtype=torch.float32)
        return dx.view(ctx.shape), dw

class FP8Linear(nn.Linear):
    def forward(self, x):
        return FP8MM.apply(x.to(torch.bfloat16), self.weight.to(torch.bfloat16))

def swap(m):
    for name, c in m.named_children():
        if isinstance(c, nn.Linear) and name != "head" and c.bias is None:
            n = FP8Linear(c.in_features, c.out_features, bias=False, device=c.weight.device); n.weight = c.weight
            setattr(m, name, n)
        else: swap(c)
    return m

def run(name, fp8, B, T, steps=8, warm=3, **cfg):
    torch.cuda.empty_cache(); torch.cuda.reset_peak_memory_stats()
    try:
        m = tb.LM(cfg["arch"], cfg["vocab"], cfg["d"], cfg["L"], cfg["h"], cfg.get("kv"), cfg.get("ffn"), T).cuda()
        if fp8: swap(m)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4, fused=True); f = torch.compile(m)
        idx = torch.randint(0, cfg["vocab"], (B, T), device="cuda")
        def step():
            with torch.autocast("cuda", dtype=torch.bfloat16): loss = f(idx, idx)
            loss.backward(); opt.step(); opt.zero_grad(set_to_none=True); return loss
        for _ in range(warm): step()
        torch.cuda.synchronize(); t = time.perf_counter()
        for _ in range(steps): loss = step()
        torch.cuda.synchronize(); dt = (time.perf_counter() - t) / steps
        print(json.dumps(dict(kind="train", name=name, precision="fp8" if fp8 else "bf16", compile=True, B=B, T=T,
              tok_s=B * T / dt, step_ms=dt * 1e3, peak_gib=torch.cuda.max_memory_allocated() / 2**30, loss=float(loss.detach()))), flush=True)
        del m, opt, f
    except Exception as e:
        print(json.dumps(dict(name=name, fp8=fp8, error=type(e).__name__ + ": " + str(e)[:300])), flush=True)

if __name__ == "__main__":
    tl = dict(arch="llama", vocab=32000, d=2048, L=22, h=32, kv=4, ffn=5632)
    l3 = dict(arch="llama", vocab=128256, d=3072, L=28, h=24, kv=8, ffn=8192)
    which = sys.argv[1] if len(sys.argv) > 1 else "all"
    if which in ("all", "1b"):
        for fp8 in (False, True): run("llama-1b", fp8, 8, 2048, **tl)
    if which in ("all", "3b"):
        for fp8 in (True,) if which == "3b" else (False, True): run("llama-3b", fp8, 4, 2048, **l3)
