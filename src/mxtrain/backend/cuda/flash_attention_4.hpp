// FlashAttention-4's Hopper attention backward (PyPI flash-attn-4: FlashAttention-3's sm_90
// backward in NVIDIA's CuTe DSL), compiled ahead of time by scripts/fa4_kernels.sh and linked
// when mxtrain is configured with -DMXTRAIN_FLASH_ATTENTION_4=<folder> (docs/attention.md).
// train.attention_backward = flash-attention-4 runs it after cuDNN's forward: it reads cuDNN's
// O and softmax statistics (natural-log LSE) and writes dQ, dK, dV into the packed dqkv rows,
// about 1.25x faster than cuDNN's backward at head dimension 64 on an H200
// (bench/results/h200_attention_libraries.md). It is not bit-reproducible (dQ is summed with
// atomics): train.deterministic keeps cuDNN's deterministic backward.
#pragma once
#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "mxtrain/backend/backend.hpp"

namespace mxtrain::flash_attention_4 {

// The configurations this build carries, as "d<head_dim>_g<query heads per kv head>"; empty
// when mxtrain was built without them.
std::vector<std::string> carried();

// "" when the backward can run `shape` with `io` (bf16) activations in this build, else why and
// what to do.
std::string unsupported(const AttentionShape& shape, DType io);

// dqkv's Q, K and V column blocks from the packed q|k|v rows `qkv` [batch*seq, (H+2KV)*D], the
// attention output `out` and `dout` [batch*seq, H*D], and `lse` f32 [batch, heads, seq], all
// bf16 but lse; `workspace` holds private_buffers::flash_attention_4_workspace(shape).bytes().
// The shape must be one unsupported() accepts (the caller checks it and names the fix).
void backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dqkv,
              const AttentionShape& shape, float softmax_scale, void* workspace, cudaStream_t stream);

}  // namespace mxtrain::flash_attention_4
