# The PyTorch baseline of docs/benchmarking.md (the protocol): kept in the repository so that it travels to
# the GPU machine with it.
"""PyTorch baselines on one GPU: GEMM ceilings and transformer training throughput.
Prints one JSON line per measurement: what a user would run instead of mxtrain.
Usage: python3 torch_baseline.py [all|gemm|gpt2|gpt2xl|llama|big]"""
import json, math, os, sys, time, torch, torch.nn as nn, torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

dev = "cuda"
torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.allow_tf32 = True

def emit(**kw):
    print(json.dumps(kw), flush=True)

def gemm_ceiling(n=8192):
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16); b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    for _ in range(3): a @ b
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(20): a @ b
    torch.cuda.synchronize(); dt = (time.perf_counter() - t) / 20
    emit(kind="gemm", dtype="bf16", n=n, tflops=2 * n**3 / dt / 1e12)
    try:
        a8 = a.to(torch.float8_e4m3fn); b8 = b.to(torch.float8_e4m3fn).t().contiguous().t()
        one = torch.tensor(1.0, device=dev)
        for _ in range(3): torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        torch.cuda.synchronize(); t = time.perf_counter()
        for _ in range(20): torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        torch.cuda.synchronize(); dt = (time.perf_counter() - t) / 20
        emit(kind="gemm", dtype="fp8e4m3", n=n, tflops=2 * n**3 / dt / 1e12)
    except Exception as e:
        emit(kind="gemm", dtype="fp8e4m3", error=str(e)[:300])
    x = torch.empty(2 * 1024**3, dtype=torch.uint8, device=dev); y = torch.empty_like(x)
    for _ in range(3): y.copy_(x)
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(20): y.copy_(x)
    torch.cuda.synchronize(); dt = (time.perf_counter() - t) / 20
    emit(kind="copy", gbps=2 * x.numel() / dt / 1e9)
    del a, b, x, y

class RMSNorm(nn.Module):
    def __init__(s, d): super().__init__(); s.w = nn.Parameter(torch.ones(d))
    def forward(s, x): return F.rms_norm(x, (x.shape[-1],), s.w, 1e-5)

def rope(x, cos, sin):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)

class LlamaBlock(nn.Module):
    def __init__(s, d, h, kv, ffn):
        super().__init__(); s.h, s.kv, s.hd = h, kv, d // h
        s.n1, s.n2 = RMSNorm(d), RMSNorm(d)
        s.qkv = nn.Linear(d, (h + 2 * kv) * s.hd, bias=False); s.o = nn.Linear(d, d, bias=False)
        s.gu = nn.Linear(d, 2 * ffn, bias=False); s.down = nn.Linear(ffn, d, bias=False)
    def forward(s, x, cos, sin):
        B, T, D = x.shape
        q, k, v = s.qkv(s.n1(x)).split([s.h * s.hd, s.kv * s.hd, s.kv * s.hd], -1)
        q = rope(q.view(B, T, s.h, s.hd).transpose(1, 2), cos, sin)
        k = rope(k.view(B, T, s.kv, s.hd).transpose(1, 2), cos, sin)
        v = v.view(B, T, s.kv, s.hd).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=(s.kv != s.h))
        x = x + s.o(a.transpose(1, 2).reshape(B, T, D))
        g, u = s.gu(s.n2(x)).chunk(2, -1)
        return x + s.down(F.silu(g) * u)

class GPT2Block(nn.Module):
    def __init__(s, d, h, ffn=None):
        super().__init__(); s.h = h; f = ffn or 4 * d
        s.ln1, s.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        s.qkv = nn.Linear(d, 3 * d); s.o = nn.Linear(d, d); s.fc = nn.Linear(d, f); s.proj = nn.Linear(f, d)
    def forward(s, x, cos, sin):
        B, T, D = x.shape
        q, k, v = s.qkv(s.ln1(x)).split(D, -1)
        q, k, v = (t.view(B, T, s.h, D // s.h).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + s.o(a.transpose(1, 2).reshape(B, T, D))
        return x + s.proj(F.gelu(s.fc(s.ln2(x)), approximate="tanh"))

class LM(nn.Module):
    def __init__(s, arch, vocab, d, L, h, kv=None, ffn=None, T=1024, ckpt=False):
        super().__init__(); s.arch, s.ckpt = arch, ckpt
        s.emb = nn.Embedding(vocab, d)
        if arch == "gpt2":
            s.pos = nn.Embedding(T, d); s.blocks = nn.ModuleList(GPT2Block(d, h, ffn) for _ in range(L)); s.nf = nn.LayerNorm(d)
        else:
            s.blocks = nn.ModuleList(LlamaBlock(d, h, kv, ffn) for _ in range(L)); s.nf = RMSNorm(d)
        s.head = nn.Linear(d, vocab, bias=False)
        if arch == "gpt2": s.head.weight = s.emb.weight
        for mod in s.modules():
            if isinstance(mod, (nn.Linear, nn.Embedding)): nn.init.normal_(mod.weight, std=0.02)
        hd = d // h; inv = 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd)); f = torch.outer(torch.arange(T).float(), inv)
        s.register_buffer("cos", f.cos(), persistent=False)
        s.register_buffer("sin", f.sin(), persistent=False)
    def forward(s, idx, tgt):
        x = s.emb(idx)
        if s.arch == "gpt2": x = x + s.pos(torch.arange(idx.shape[1], device=idx.device))
        cos, sin = s.cos[: idx.shape[1]].to(x.dtype), s.sin[: idx.shape[1]].to(x.dtype)
        for b in s.blocks:
            x = checkpoint(b, x, cos, sin, use_reentrant=False) if s.ckpt else b(x, cos, sin)
        logits = s.head(s.nf(x))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), tgt.view(-1))

def train_bench(name, arch, vocab, d, L, h, kv=None, ffn=None, B=8, T=1024, ckpt=False, compile=False, steps=10, warm=3):
    torch.cuda.empty_cache(); torch.cuda.reset_peak_memory_stats()
    try:
        m = LM(arch, vocab, d, L, h, kv, ffn, T, ckpt).to(dev)
        nparam = sum(p.numel() for p in m.parameters())
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4, fused=True)
        fwd = torch.compile(m) if compile else m
        idx = torch.randint(0, vocab, (B, T), device=dev); tgt = torch.randint(0, vocab, (B, T), device=dev)
        def step():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = fwd(idx, tgt)
            loss.backward(); opt.step(); opt.zero_grad(set_to_none=True); return loss
        for _ in range(warm): step()
        torch.cuda.synchronize(); t = time.perf_counter()
        for _ in range(steps): loss = step()
        torch.cuda.synchronize(); dt = (time.perf_counter() - t) / steps
        tok = B * T / dt
        nonemb = nparam - vocab * d * (1 if arch == "gpt2" else 2)
        flops_tok = 6 * (nparam - (vocab * d if arch == "gpt2" else vocab * d)) + 12 * L * d * T  # 6N (no input emb) + attn (PaLM)
        emit(kind="train", name=name, arch=arch, params=nparam, B=B, T=T, ckpt=ckpt, compile=compile, step_ms=dt * 1e3,
             tok_s=tok, tflops=tok * flops_tok / 1e12, peak_gib=torch.cuda.max_memory_allocated() / 2**30, loss=float(loss.detach()))
        del m, opt, fwd
    except Exception as e:
        emit(kind="train", name=name, B=B, T=T, ckpt=ckpt, compile=compile, error=type(e).__name__ + ": " + str(e)[:200])
    torch.cuda.empty_cache()

if __name__ == "__main__":
    which = sys.argv[1] if len(sys.argv) > 1 else "all"
    if which in ("all", "gemm"): gemm_ceiling()
    if which in ("all", "gpt2"):
        for c in (False, True):
            train_bench("gpt2-124M", "gpt2", 50304, 768, 12, 12, B=64, T=1024, compile=c)
    if which in ("all", "gpt2xl"):
        for c in (False, True):
            train_bench("gpt2-1.5B", "gpt2", 50304, 1600, 48, 25, B=16, T=1024, compile=c, steps=6)
    if which in ("all", "llama"):
        tl = dict(arch="llama", vocab=32000, d=2048, L=22, h=32, kv=4, ffn=5632)
        train_bench("tinyllama-1.1B", B=8, T=2048, **tl)
        train_bench("tinyllama-1.1B", B=8, T=2048, compile=True, **tl)
        train_bench("tinyllama-1.1B", B=1, T=8192, **tl)
        train_bench("tinyllama-1.1B", B=1, T=8192, ckpt=True, **tl)
        train_bench("tinyllama-1.1B", B=16, T=8192, ckpt=True, steps=5, warm=2, **tl)
    if which in ("all", "te"):
        # TransformerEngine's FSDP example layer (LayerNorm, GELU, bias, FFN 3x) at the seed's settings, with an LM head
        train_bench("te-fsdp-10L", "gpt2", 32000, 2048, 10, 16, ffn=6144, B=8, T=2048)
    if which in ("all", "3b"):
        l3 = dict(arch="llama", vocab=128256, d=3072, L=28, h=24, kv=8, ffn=8192)
        train_bench("llama-3b", B=4, T=2048, **l3)
        train_bench("llama-3b", B=4, T=2048, compile=True, **l3)
    if which in ("all", "big"):
        l8 = dict(arch="llama", vocab=128256, d=4096, L=32, h=32, kv=8, ffn=14336)
        train_bench("llama3-8B", B=1, T=4096, ckpt=True, steps=4, warm=2, **l8)
