#include "mxtrain/backend/cuda/flash_attention_4.hpp"

#include "mxtrain/backend/cuda/cuda_check.hpp"
#include "mxtrain/backend/private_buffers.hpp"
#include "mxtrain/core/error.hpp"

#if MXTRAIN_HAVE_FLASH_ATTENTION_4
#include <tvm/ffi/extra/c_env_api.h>

#include "mxtrain/backend/cuda/tvm_ffi_call.hpp"

// The exported functions (scripts/fa4_export.py): __tvm_ffi_mxtrain_fa4_<tag>_<name>, one set a
// configuration; the generated table names each configuration MXTRAIN_FA4_GROUPED (with a dK/dV
// postprocess) or MXTRAIN_FA4_MULTI_HEAD (the main kernel writes dK and dV itself).
#define MXTRAIN_FA4_MULTI_HEAD(tag, head_dim, group, query_tile, key_tile, rounded_head_dim) \
  int __tvm_ffi_mxtrain_fa4_##tag##_bwd_pre(void*, const TVMFFIAny*, int32_t, TVMFFIAny*);  \
  int __tvm_ffi_mxtrain_fa4_##tag##_bwd(void*, const TVMFFIAny*, int32_t, TVMFFIAny*);      \
  int __tvm_ffi_mxtrain_fa4_##tag##_bwd_post_dq(void*, const TVMFFIAny*, int32_t, TVMFFIAny*);
#define MXTRAIN_FA4_GROUPED(tag, head_dim, group, query_tile, key_tile, rounded_head_dim) \
  MXTRAIN_FA4_MULTI_HEAD(tag, head_dim, group, query_tile, key_tile, rounded_head_dim)  \
  int __tvm_ffi_mxtrain_fa4_##tag##_bwd_post_dkv(void*, const TVMFFIAny*, int32_t, TVMFFIAny*);
extern "C" {
#include "mxtrain/flash_attention_4_kernels.inc"
}
#undef MXTRAIN_FA4_MULTI_HEAD
#undef MXTRAIN_FA4_GROUPED
#endif

namespace mxtrain::flash_attention_4 {

#if MXTRAIN_HAVE_FLASH_ATTENTION_4
namespace {

using tvm_ffi::kBf16;
using tvm_ffi::kF32;
using tvm_ffi::none;
using tvm_ffi::Packed;
using tvm_ffi::raised_error;
using tvm_ffi::real;
using tvm_ffi::View;

struct Kernels {
  const char* tag;
  int64_t head_dim, group, query_tile, key_tile, rounded_head_dim;
  Packed pre, main, post_dq, post_dkv;
};

#define MXTRAIN_FA4_KERNELS(tag, head_dim, group, query_tile, key_tile, rounded_head_dim, post_dkv)            \
  Kernels{#tag, head_dim, group, query_tile, key_tile, rounded_head_dim, __tvm_ffi_mxtrain_fa4_##tag##_bwd_pre, \
          __tvm_ffi_mxtrain_fa4_##tag##_bwd, __tvm_ffi_mxtrain_fa4_##tag##_bwd_post_dq, post_dkv},
#define MXTRAIN_FA4_MULTI_HEAD(tag, head_dim, group, query_tile, key_tile, rounded_head_dim) \
  MXTRAIN_FA4_KERNELS(tag, head_dim, group, query_tile, key_tile, rounded_head_dim, nullptr)
#define MXTRAIN_FA4_GROUPED(tag, head_dim, group, query_tile, key_tile, rounded_head_dim) \
  MXTRAIN_FA4_KERNELS(tag, head_dim, group, query_tile, key_tile, rounded_head_dim,     \
                      __tvm_ffi_mxtrain_fa4_##tag##_bwd_post_dkv)
const Kernels kKernels[] = {
#include "mxtrain/flash_attention_4_kernels.inc"
};
#undef MXTRAIN_FA4_KERNELS
#undef MXTRAIN_FA4_MULTI_HEAD
#undef MXTRAIN_FA4_GROUPED

const Kernels* find(const AttentionShape& shape) {
  for (const Kernels& k : kKernels)
    if (k.head_dim == shape.head_dim && k.group == shape.heads / shape.kv_heads) return &k;
  return nullptr;
}

void call(const char* what, Packed fn, std::initializer_list<TVMFFIAny> args) {
  const std::string error = tvm_ffi::call(fn, args);
  if (!error.empty())
    throw Error(ErrorKind::system, std::string("FlashAttention-4's ") + what + " failed: " + error,
                "set train.attention_backward = cudnn, and report this with the log");
}

// The (None, None) auxiliary-data tuple the compiled functions take: made on first use and kept.
TVMFFIAny none_pair() {
  static TVMFFIAny pair = [] {
    TVMFFIAny made;
    const std::string error = tvm_ffi::make_none_pair(&made);
    if (!error.empty())
      throw Error(ErrorKind::system, "TVM-FFI's ffi.Array failed: " + error,
                  "libtvm_ffi.so found at run time must be the one of scripts/fa4_kernels.sh's folder");
    return made;
  }();
  return pair;
}

}  // namespace

std::vector<std::string> carried() {
  std::vector<std::string> tags;
  for (const Kernels& k : kKernels) tags.push_back(k.tag);
  return tags;
}

std::string unsupported(const AttentionShape& shape, DType io) {
  std::string why = private_buffers::flash_attention_4_unsupported(shape, io == DType::f32 ? DType::bf16 : io);
  if (!why.empty()) return why;
  const Kernels* k = find(shape);
  if (k == nullptr) {
    std::string list;
    for (const std::string& t : carried()) list += (list.empty() ? "" : ", ") + t;
    const std::string tag = strf("d%lld_g%lld", static_cast<long long>(shape.head_dim),
                                 static_cast<long long>(shape.heads / shape.kv_heads));
    return "this build carries FlashAttention-4 kernels for " + list + ", not " + tag +
           " (head dimension, query heads per key/value head); export it: scripts/fa4_kernels.sh .fa4-kernels " +
           strf("%lld:%lld", static_cast<long long>(shape.head_dim),
                static_cast<long long>(shape.heads / shape.kv_heads)) +
           " (with the others), then rebuild";
  }
  const private_buffers::FlashAttention4Workspace w = private_buffers::flash_attention_4_workspace(shape);
  if (k->query_tile != w.query_tile || k->key_tile != w.key_tile || k->rounded_head_dim != w.rounded_head_dim)
    return strf("its %s kernels were compiled for %lldx%lld tiles and head dimension %lld rounded to %lld, but mxtrain "
                "sizes the workspace for %lldx%lld and %lld: they come from another flash-attn-4 version than "
                "scripts/fa4_kernels.sh pins; re-export them with it",
                k->tag, static_cast<long long>(k->query_tile), static_cast<long long>(k->key_tile),
                static_cast<long long>(k->head_dim), static_cast<long long>(k->rounded_head_dim),
                static_cast<long long>(w.query_tile), static_cast<long long>(w.key_tile),
                static_cast<long long>(w.rounded_head_dim));
  return "";
}

void backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dqkv,
              const AttentionShape& s, float softmax_scale, void* workspace, cudaStream_t stream) {
  MXTRAIN_ASSERT(qkv.dtype == DType::bf16 && dout.dtype == DType::bf16 && out.dtype == DType::bf16 &&
                     dqkv.dtype == DType::bf16 && lse.dtype == DType::f32,
                 "flash_attention_4::backward: dtypes");
  // The caller has checked the shape (CudnnAttention::check_backward, which names the fix).
  const Kernels* found = find(s);
  MXTRAIN_ASSERT(found != nullptr, "flash_attention_4::backward: head_dim %lld, group %lld was not checked",
                 static_cast<long long>(s.head_dim), static_cast<long long>(s.heads / s.kv_heads));
  const Kernels& k = *found;
  const private_buffers::FlashAttention4Workspace w = private_buffers::flash_attention_4_workspace(s);
  int device = 0;
  MXTRAIN_CUDA_CHECK(cudaGetDevice(&device));
  if (TVMFFIEnvSetStream(kDLCUDA, device, stream, nullptr) != 0)
    throw Error(ErrorKind::system, "TVM-FFI could not take mxtrain's CUDA stream: " + raised_error(),
                "set train.attention_backward = cudnn, and report this with the log");

  const int64_t B = s.batch, T = s.seq, H = s.heads, KV = s.kv_heads, D = s.head_dim, W = s.qkv_cols();
  const int64_t Tq = w.seq_q_rounded, Tk = w.seq_k_rounded, Dr = w.rounded_head_dim;
  char* in = static_cast<char*>(qkv.data);
  char* grad = static_cast<char*>(dqkv.data);
  char* space = static_cast<char*>(workspace);
  // q, k, v and their gradients as strided [B, T, heads, D] views of the packed rows.
  View q(in, kBf16, device, {B, T, H, D}, {T * W, W, D, 1});
  View k_(in + H * D * 2, kBf16, device, {B, T, KV, D}, {T * W, W, D, 1});
  View v(in + (H + KV) * D * 2, kBf16, device, {B, T, KV, D}, {T * W, W, D, 1});
  View dq(grad, kBf16, device, {B, T, H, D}, {T * W, W, D, 1});
  View dk(grad + H * D * 2, kBf16, device, {B, T, KV, D}, {T * W, W, D, 1});
  View dv(grad + (H + KV) * D * 2, kBf16, device, {B, T, KV, D}, {T * W, W, D, 1});
  View o(out.data, kBf16, device, {B, T, H, D}, {T * H * D, H * D, D, 1});
  View d_o(dout.data, kBf16, device, {B, T, H, D}, {T * H * D, H * D, D, 1});
  View l(lse.data, kF32, device, {B, H, T}, {H * T, T, 1});
  View dpsum(space + w.dpsum_offset(), kF32, device, {B, H, Tq}, {H * Tq, Tq, 1});
  View lse_log2(space + w.lse_log2_offset(), kF32, device, {B, H, Tq}, {H * Tq, Tq, 1});
  View dq_accum(space + w.dq_accum_offset(), kF32, device, {B, H, Tq * Dr}, {H * Tq * Dr, Tq * Dr, 1});
  View dk_accum(space + w.dk_accum_offset(), kF32, device, {B, KV, Tk * Dr}, {KV * Tk * Dr, Tk * Dr, 1});
  View dv_accum(space + w.dv_accum_offset(), kF32, device, {B, KV, Tk * Dr}, {KV * Tk * Dr, Tk * Dr, 1});
  const bool grouped = H != KV;
  MXTRAIN_ASSERT(!grouped || k.post_dkv != nullptr, "FlashAttention-4 %s: no dK/dV postprocess was linked", k.tag);
  const TVMFFIAny n = none(), pair = none_pair();

  // Grouped heads: dK and dV are summed over each group's query heads into zeroed FP32
  // accumulators, then written in bf16 by a postprocess. The preprocess computes rowsum(dO * O)
  // and the log2 LSE, and clears the dQ accumulator.
  if (grouped) MXTRAIN_CUDA_CHECK(cudaMemsetAsync(space + w.dk_accum_offset(), 0, 2 * w.dkv_accum_bytes, stream));
  call("backward preprocess", k.pre,
       {o.any(), d_o.any(), dpsum.any(), l.any(), lse_log2.any(), dq_accum.any(), n, n, n, n, n, real(1.0), n, n});
  call("backward", k.main,
       {q.any(), k_.any(), v.any(), d_o.any(), lse_log2.any(), dpsum.any(), dq_accum.any(),
        grouped ? dk_accum.any() : dk.any(), grouped ? dv_accum.any() : dv.any(), real(softmax_scale), n, n, n, n, n,
        n, n, n, n, pair, n, n});
  call("dQ postprocess", k.post_dq, {dq_accum.any(), dq.any(), real(softmax_scale), n, n, n, n});
  if (grouped) {
    call("dK postprocess", k.post_dkv, {dk_accum.any(), dk.any(), real(softmax_scale), n, n, n, n});
    call("dV postprocess", k.post_dkv, {dv_accum.any(), dv.any(), real(1.0), n, n, n, n});
  }
}

#else  // built without -DMXTRAIN_FLASH_ATTENTION_4

std::vector<std::string> carried() { return {}; }

std::string unsupported(const AttentionShape&, DType) {
  return "this mxtrain was built without FlashAttention-4's kernels: export them with scripts/fa4_kernels.sh "
         "and configure with -DMXTRAIN_FLASH_ATTENTION_4=<that folder> (docs/attention.md)";
}

void backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const AttentionShape& shape,
              float, void*, cudaStream_t) {
  throw Error(ErrorKind::unsupported, "train.attention_backward = flash-attention-4: " + unsupported(shape, DType::bf16),
              "set train.attention_backward = cudnn, or rebuild with the kernels");
}

#endif

}  // namespace mxtrain::flash_attention_4
