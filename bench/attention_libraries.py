"""Which attention kernels does the GPU machine's Python have, and how fast are they at the
trainer's shapes beside cuDNN's (PyTorch SDPA with the cuDNN backend, the kernels mxtrain and
PyTorch's baseline both run)? Causal, grouped-query, BF16, forward and backward; each the least
of 5 rounds of the mean of 10 runs after 3 warm-ups. A library that is not installed prints so.
Each other library's output and gradients are compared with cuDNN's (relative L2 error).

FlashAttention-4 (PyPI `flash-attn-4`, CuTe DSL kernels for Hopper and Blackwell) is not on the
GPU machine; its wheels and their needs travel with the call (bench/results/h200_attention_libraries.md
says how).

Usage (GPU machine): python3 bench/attention_libraries.py
Results: bench/results/h200_attention_libraries.md."""
import importlib, importlib.metadata as md, time
import torch
import torch.nn.functional as F

SHAPES = [("llama-1b", 8, 2048, 32, 4, 64), ("llama-3b", 4, 2048, 24, 8, 128), ("gpt2-124m", 64, 1024, 12, 12, 64),
          ("gpt2-1.5b", 16, 1024, 25, 25, 64)]

print("# torch %s, cuda %s, cudnn %s, %s" % (torch.__version__, torch.version.cuda, torch.backends.cudnn.version(),
                                             torch.cuda.get_device_name()))
for dist in ("flash-attn", "flash_attn", "flash-attn-3", "flash_attn_3", "flashinfer-python", "xformers",
             "nvidia-cudnn-frontend", "transformer-engine", "nvidia-cutlass", "nvidia-cutlass-dsl", "flash-attn-4",
             "quack-kernels", "triton"):
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
for module, name in (("flash_attn_interface", "flash-attention 3"), ("flash_attn", "flash-attention 2"),
                     ("flash_attn.cute", "flash-attention 4")):
    try:
        m = importlib.import_module(module)
        if not hasattr(m, "flash_attn_func"):
            raise ImportError("%s has no flash_attn_func" % module)
        candidates.append((name, "bthd", lambda q, k, v, m=m: m.flash_attn_func(q, k, v, causal=True)))
    except Exception as e:  # not installed, or built for another GPU
        print("%s: %s (%s)" % (name, "not importable", str(e).splitlines()[0][:120] if str(e) else type(e).__name__))


def rel_l2(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm().clamp(min=1e-30))

for model, B, T, H, KV, D in SHAPES:
    flops_fwd = 4 * B * T * T * H * D / 2  # causal
    gen = torch.Generator(device="cuda").manual_seed(0)
    # One set of inputs in [B, T, heads, D] (the trainer's order); each layout a view of it.
    base = [torch.randn((B, T, n, D), device="cuda", dtype=torch.bfloat16, generator=gen) for n in (H, KV, KV)]
    base_grad = torch.randn((B, T, H, D), device="cuda", dtype=torch.bfloat16, generator=gen)
    reference = None
    for name, layout, fn in candidates:
        q, k, v = [(t.transpose(1, 2) if layout == "bhtd" else t).detach().clone().requires_grad_(True) for t in base]
        grad = base_grad.transpose(1, 2) if layout == "bhtd" else base_grad
        try:
            started = time.time()
            out = fn(q, k, v)
            out = out[0] if isinstance(out, tuple) else out
            out.backward(grad)
            torch.cuda.synchronize()
            print("%s %s: first forward+backward %.1f s (a JIT library compiles its kernels here)"
                  % (model, name, time.time() - started))
            as_bthd = [(t.transpose(1, 2) if layout == "bhtd" else t).detach() for t in (out, q.grad, k.grad, v.grad)]
            if reference is None:
                reference = as_bthd
            else:
                print("%s %s: relative L2 error against cuDNN: O %.2e dQ %.2e dK %.2e dV %.2e"
                      % ((model, name) + tuple(rel_l2(a, b) for a, b in zip(as_bthd, reference))))
            def forward_backward():  # autograd.grad: no accumulation into .grad inside the timing
                o = fn(q, k, v)
                torch.autograd.grad(o[0] if isinstance(o, tuple) else o, (q, k, v), grad)

            fwd = timed(lambda: fn(q, k, v))
            both = timed(forward_backward)
        except Exception as e:
            import traceback
            print("%s %s: failed (%s: %s)" % (model, name, type(e).__name__, str(e)[:600]))
            traceback.print_exc(limit=-4)
            continue
        print("%s %s: forward %.4f ms (%.0f TFLOP/s), forward+backward %.4f ms (backward %.4f ms, %.0f TFLOP/s)"
              % (model, name, fwd, flops_fwd / fwd / 1e9, both, both - fwd, 2.5 * flops_fwd / (both - fwd) / 1e9))
