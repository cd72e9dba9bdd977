// Causal grouped-query attention through cudnn-frontend's SDPA graphs (flash attention on
// Hopper). Q, K and V are read straight from the packed qkv rows [batch*seq, (H+2KV)*D] through
// strides, O is written as [batch*seq, H*D], the softmax statistics (log-sum-exp, natural log)
// as f32 [batch, heads, seq]; backward writes dQ/dK/dV into the packed dqkv the same way. One
// graph per (shape, dtype, direction, determinism) is built on first use and cached.
//
// There is no hand-written fallback: a shape cuDNN cannot run is Error(unsupported) naming the
// shape and the rule. f32 activations (the fp32 precision mode) run the bf16 SDPA on rounded
// copies, because cuDNN has no f32 flash attention; this is logged once.
//
// The workspace is one buffer from the backend's allocator ("cudnn.workspace",
// Lifetime::workspace) grown to the largest size any graph has asked for
// (private_buffers::attention_workspace); each graph's size comes from cuDNN's plan
// (get_workspace_size), a device fact: recorded in `facts` when given, the size held so far
// reported through workspace_bytes().
// train.attention_backward = flash-attention-4 runs the backward through FlashAttention-4's
// kernels instead (flash_attention_4.hpp), from cuDNN's forward O and statistics, its FP32
// buffers in the same workspace (private_buffers::flash_attention_4_workspace).
// This file is its own translation unit because the cudnn-frontend headers are slow to compile.
#pragma once
#include <cuda_runtime_api.h>

#include <memory>

#include "mxtrain/backend/backend.hpp"
#include "mxtrain/backend/private_buffers.hpp"

namespace mxtrain {

class CudnnAttention {
 public:
  explicit CudnnAttention(Backend& backend, private_buffers::DeviceFacts* facts = nullptr);
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // Deterministic backward: cuDNN's dQ accumulation in a fixed order (bit-reproducible runs).
  void set_deterministic(bool deterministic);
  bool deterministic() const;
  size_t workspace_bytes() const;
  // The backward through FlashAttention-4's kernels (flash_attention_4.hpp) instead of cuDNN's
  // graph; Error(config) when the build carries none.
  void set_flash_attention_4_backward(bool enabled);
  bool flash_attention_4_backward() const;
  // Error(config or unsupported), with the fix, when the backward cannot run `shape` with `io`
  // activations as set (FlashAttention-4: a configuration the build lacks, a single tile,
  // deterministic); cuDNN's rules are checked when its graph is built.
  void check_backward(const AttentionShape& shape, DType io) const;

  void forward(const Tensor& qkv, const Tensor& out, const Tensor& lse, const AttentionShape& shape,
               cudaStream_t stream);
  void backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dqkv,
                const AttentionShape& shape, cudaStream_t stream);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mxtrain
