"""The ceilings of one GPU that docs/benchmarking.md quotes, measured with PyTorch (cuBLAS):
a BF16 GEMM 8192^3, an FP8 E4M3 GEMM 8192^3 (torch._scaled_mm, per-tensor scales) and a
device-to-device copy (bytes read + written). Prints one JSON line. Usage, on the GPU machine:
    python3 bench/ceilings.py > bench/results/<gpu>_ceilings_<commit>.json"""
import json
import sys

import torch


def timed(function, repeats=50, warmup=10):
    for _ in range(warmup):
        function()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        function()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / repeats  # seconds per call


n = 8192
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
bf16_s = timed(lambda: a @ b)
a8 = a.to(torch.float8_e4m3fn)
b8 = b.t().contiguous().to(torch.float8_e4m3fn).t()  # column-major second operand, as _scaled_mm needs
one = torch.ones((), device="cuda")
fp8_s = timed(lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
source = torch.empty(1 << 30, device="cuda", dtype=torch.uint8)  # 1 GiB
target = torch.empty_like(source)
copy_s = timed(lambda: target.copy_(source), repeats=20)
print(json.dumps({
    "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
    "bf16_gemm_8192_tflops": round(2 * n ** 3 / bf16_s / 1e12, 1),
    "fp8_e4m3_gemm_8192_tflops": round(2 * n ** 3 / fp8_s / 1e12, 1),
    "device_copy_tb_per_s": round(2 * source.numel() / copy_s / 1e12, 3),
    "command": "python3 bench/ceilings.py", "argv": sys.argv[1:]}))
