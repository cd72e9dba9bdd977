"""Which attention kernels does the GPU machine's Python have, and how fast are they at the
trainer's shapes beside cuDNN's (PyTorch SDPA with the cuDNN backend, the kernels mxtrain and
PyTorch's baseline both run)? Causal, grouped-query, BF16, forward and backward; each the least
of 5 rounds of the mean of 10 runs after 3 warm-ups. A library that is not installed prints so.

Usage (GPU machine): python3 bench/attention_libraries.py
Results: bench/results/h200_attention_libraries.md."""
import importlib, importlib.metadata as md
import torch
import torch.nn.functional as F

SHAPES = [("llama-1b", 8, 2048, 32, 4, 64), ("llama-3b", 4, 2048, 24, 8, 128)]

print("# torch %s, cuda %s, cudnn %s, %s" % (torch.__version__, torch.version.cuda, torch.backends.cudnn.version(),
                                             torch.cuda.get_device_name()))
for dist in ("flash-attn", "flash_attn", "flash-attn-3", "flash_attn_3", "flashinfer-python", "xformers",
             "nvidia-cudnn-frontend", "transformer-engine", "nvidia-cutlass", "nvidia-cutlass-dsl", "triton"):
    try:
        print("package %s %s" % (dist, md.version(dist)))
    except md.PackageNotFoundError:
        print("package %s: not installed" % dist)


def timed(fn):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(10):
            fn()
        b.record()
        b.synchronize()
        best = min(best, a.elapsed_time(b) / 10)
    return best


def sdpa_cudnn(q, k, v):  # q [B, H, T, D]; k, v [B, KV, T, D]
    from torch.nn.attention import sdpa_kernel, SDPBackend
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


candidates = [("cudnn (torch sdpa)", "bhtd", sdpa_cudnn)]
for module, name in (("flash_attn_interface", "flash-attention 3"), ("flash_attn", "flash-attention 2")):
    try:
        m = importlib.import_module(module)
        candidates.append((name, "bthd", lambda q, k, v, m=m: m.flash_attn_func(q, k, v, causal=True)))
    except Exception as e:  # not installed, or built for another GPU
        print("%s: %s (%s)" % (name, "not importable", str(e).splitlines()[0][:120] if str(e) else type(e).__name__))

for model, B, T, H, KV, D in SHAPES:
    flops_fwd = 4 * B * T * T * H * D / 2  # causal
    for name, layout, fn in candidates:
        shape_q, shape_kv = ((B, H, T, D), (B, KV, T, D)) if layout == "bhtd" else ((B, T, H, D), (B, T, KV, D))
        q = torch.randn(shape_q, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(shape_kv, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(shape_kv, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        try:
            out = fn(q, k, v)
            out = out[0] if isinstance(out, tuple) else out
            grad = torch.randn_like(out)
            def forward_backward():
                o = fn(q, k, v)
                (o[0] if isinstance(o, tuple) else o).backward(grad)

            fwd = timed(lambda: fn(q, k, v))
            both = timed(forward_backward)
        except Exception as e:
            print("%s %s: failed (%s)" % (model, name, str(e).splitlines()[0][:160]))
            continue
        print("%s %s: forward %.4f ms (%.0f TFLOP/s), forward+backward %.4f ms (backward %.4f ms, %.0f TFLOP/s)"
              % (model, name, fwd, flops_fwd / fwd / 1e9, both, both - fwd, 2.5 * flops_fwd / (both - fwd) / 1e9))
