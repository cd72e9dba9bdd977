"""Writes the whole-model fixtures mxtrain's CPU backend is checked against (tests/model/fixture_test.cpp).

For a tiny Llama and a tiny GPT-2 (both mxtrain architectures, written out here in plain PyTorch,
float64 on the CPU): fixed random weights under mxtrain's parameter names, fixed tokens, the mean
cross-entropy loss and the gradient of every parameter. Run where PyTorch is installed:
    python3 tests/reference/make_fixtures.py tests/reference
"""
import json, math, os, sys
import torch
import torch.nn.functional as F

torch.set_default_dtype(torch.float64)


def rms_norm(x, w, eps):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


def rope(x, theta):
    # x: [B, H, T, D], rotate-half convention; inverse frequencies and angles in float32 as mxtrain does.
    D, T = x.shape[-1], x.shape[-2]
    inv = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
    ang = torch.outer(torch.arange(T, dtype=torch.float32), inv)
    cos, sin = ang.cos().double(), ang.sin().double()
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def attention(q, k, v, heads, kv_heads):
    # q [B,H,T,D], k/v [B,KV,T,D]; query head h uses kv head h // (H/KV).
    rep = heads // kv_heads
    k = k.repeat_interleave(rep, dim=1)
    v = v.repeat_interleave(rep, dim=1)
    T, D = q.shape[-2], q.shape[-1]
    scores = q @ k.transpose(-1, -2) / math.sqrt(D)
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    scores = scores.masked_fill(mask, float("-inf"))
    return torch.softmax(scores, -1) @ v


def forward(cfg, p, tokens, targets):
    B, T = tokens.shape
    C, H, KV, L = cfg["hidden"], cfg["heads"], cfg["kv_heads"], cfg["layers"]
    D = C // H
    llama = cfg["family"] == "llama"
    x = p["embed.token"][tokens]
    if not llama:
        x = x + p["embed.position"][:T]
    for i in range(L):
        pre = f"layers.{i}."
        if llama:
            h = rms_norm(x, p[pre + "attn_norm.weight"], cfg["norm_eps"])
        else:
            h = F.layer_norm(x, (C,), p[pre + "attn_norm.weight"], p[pre + "attn_norm.bias"], cfg["norm_eps"])
        qkv = h @ p[pre + "attn.qkv.weight"].T
        if not llama:
            qkv = qkv + p[pre + "attn.qkv.bias"]
        q, k, v = qkv.split([H * D, KV * D, KV * D], -1)
        q = q.view(B, T, H, D).transpose(1, 2)
        k = k.view(B, T, KV, D).transpose(1, 2)
        v = v.view(B, T, KV, D).transpose(1, 2)
        if llama:
            q, k = rope(q, cfg["rope_theta"]), rope(k, cfg["rope_theta"])
        a = attention(q, k, v, H, KV).transpose(1, 2).reshape(B, T, C)
        a = a @ p[pre + "attn.out.weight"].T
        if not llama:
            a = a + p[pre + "attn.out.bias"]
        x = x + a
        if llama:
            h = rms_norm(x, p[pre + "mlp_norm.weight"], cfg["norm_eps"])
            gu = h @ p[pre + "mlp.up.weight"].T
            g, u = gu[..., 0::2], gu[..., 1::2]  # mxtrain stores the gate/up rows interleaved
            m = F.silu(g) * u
        else:
            h = F.layer_norm(x, (C,), p[pre + "mlp_norm.weight"], p[pre + "mlp_norm.bias"], cfg["norm_eps"])
            m = F.gelu(h @ p[pre + "mlp.up.weight"].T + p[pre + "mlp.up.bias"], approximate="tanh")
        m = m @ p[pre + "mlp.down.weight"].T
        if not llama:
            m = m + p[pre + "mlp.down.bias"]
        x = x + m
    if llama:
        x = rms_norm(x, p["final_norm.weight"], cfg["norm_eps"])
    else:
        x = F.layer_norm(x, (C,), p["final_norm.weight"], p["final_norm.bias"], cfg["norm_eps"])
    head = p["embed.token"] if cfg["tied_embeddings"] else p["head.weight"]
    logits = (x @ head.T)[..., : cfg["vocab_size"]]  # padding rows of the head are not scored
    return F.cross_entropy(logits.reshape(-1, cfg["vocab_size"]), targets.reshape(-1))


def parameter_shapes(cfg):
    C, H, KV, F_, Vp = cfg["hidden"], cfg["heads"], cfg["kv_heads"], cfg["ffn_hidden"], cfg["padded_vocab"]
    D = C // H
    llama = cfg["family"] == "llama"
    shapes = {"embed.token": (Vp, C)}
    if not llama:
        shapes["embed.position"] = (cfg["max_seq_len"], C)
    for i in range(cfg["layers"]):
        pre = f"layers.{i}."
        shapes[pre + "attn_norm.weight"] = (C,)
        shapes[pre + "attn.qkv.weight"] = ((H + 2 * KV) * D, C)
        shapes[pre + "attn.out.weight"] = (C, C)
        shapes[pre + "mlp_norm.weight"] = (C,)
        shapes[pre + "mlp.up.weight"] = ((2 if llama else 1) * F_, C)
        shapes[pre + "mlp.down.weight"] = (C, F_)
        if not llama:
            for name, size in (("attn_norm.bias", C), ("mlp_norm.bias", C), ("attn.qkv.bias", 3 * C),
                               ("attn.out.bias", C), ("mlp.up.bias", F_), ("mlp.down.bias", C)):
                shapes[pre + name] = (size,)
    shapes["final_norm.weight"] = (C,)
    if not llama:
        shapes["final_norm.bias"] = (C,)
    if not cfg["tied_embeddings"]:
        shapes["head.weight"] = (Vp, C)
    return shapes


def make(cfg, batch, seq, seed, path):
    gen = torch.Generator().manual_seed(seed)
    params = {}
    for name, shape in parameter_shapes(cfg).items():
        if name.endswith("norm.weight"):
            value = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        elif name.endswith("bias"):
            value = 0.05 * torch.randn(shape, generator=gen)
        else:
            value = 0.1 * torch.randn(shape, generator=gen)
        # Stored as float32: mxtrain loads exactly these values.
        params[name] = value.float().double().requires_grad_(True)
    tokens = torch.randint(0, cfg["vocab_size"], (batch, seq), generator=gen)
    targets = torch.randint(0, cfg["vocab_size"], (batch, seq), generator=gen)
    loss = forward(cfg, params, tokens, targets)
    loss.backward()
    fixture = {
        "source": "tests/reference/make_fixtures.py (PyTorch %s, float64 on the CPU)" % torch.__version__,
        "model": cfg, "batch": batch, "seq": seq,
        "tokens": tokens.flatten().tolist(), "targets": targets.flatten().tolist(),
        "loss": loss.item(),
        "params": {n: [float("%.9g" % v) for v in p.detach().float().flatten().tolist()] for n, p in params.items()},
        "grads": {n: [float("%.10g" % v) for v in p.grad.flatten().tolist()] for n, p in params.items()},
    }
    with open(path, "w") as out:
        json.dump(fixture, out, separators=(",", ":"))
    print("wrote", path, "loss", loss.item())


if __name__ == "__main__":
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    llama = dict(family="llama", vocab_size=61, padded_vocab=64, hidden=32, layers=2, heads=4, kv_heads=2,
                 ffn_hidden=48, max_seq_len=16, norm_eps=1e-5, rope_theta=10000.0, tied_embeddings=False, bias=False)
    gpt2 = dict(family="gpt2", vocab_size=61, padded_vocab=64, hidden=32, layers=2, heads=4, kv_heads=4,
                ffn_hidden=64, max_seq_len=16, norm_eps=1e-5, rope_theta=10000.0, tied_embeddings=True, bias=True)
    make(llama, 2, 12, 1234, os.path.join(out_dir, "tiny_llama.json"))
    make(gpt2, 2, 12, 4321, os.path.join(out_dir, "tiny_gpt2.json"))
