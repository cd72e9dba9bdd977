#include "mxtrain/backend/cuda/attention.hpp"

#include <cudnn.h>
#include <cudnn_frontend.h>

#include <array>
#include <cmath>
#include <cstring>
#include <map>
#include <unordered_map>

#include "mxtrain/backend/cuda/cuda_check.hpp"
#include "mxtrain/backend/cuda/flash_attention_4.hpp"
#include "mxtrain/backend/cuda/kernels.hpp"
#include "mxtrain/core/error.hpp"
#include "mxtrain/core/log.hpp"

namespace mxtrain {

namespace fe = cudnn_frontend;

namespace {

// Tensor uids of the variant packs.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

std::string shape_text(const AttentionShape& shape) {
  return strf("batch=%lld seq=%lld heads=%lld kv_heads=%lld head_dim=%lld", static_cast<long long>(shape.batch),
              static_cast<long long>(shape.seq), static_cast<long long>(shape.heads),
              static_cast<long long>(shape.kv_heads), static_cast<long long>(shape.head_dim));
}

[[noreturn]] void unsupported_shape(const AttentionShape& shape, const std::string& rule) {
  throw Error(ErrorKind::unsupported, "cuDNN SDPA cannot run attention with " + shape_text(shape) + ": " + rule,
              "use a head dimension that is a multiple of 8 and at most 128 (64 or 128 are the fast ones), and "
              "heads a multiple of kv_heads");
}

float softmax_scale(const AttentionShape& shape) {
  return shape.softmax_scale != 0 ? shape.softmax_scale : 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
}

// Strides (in elements) of Q, K, V viewed as [batch, heads, seq, head_dim] inside the packed rows.
std::vector<int64_t> packed_qkv_strides(const AttentionShape& s) {
  const int64_t row = s.qkv_cols();
  return {s.seq * row, s.head_dim, row, 1};
}
std::vector<int64_t> output_strides(const AttentionShape& s) {
  const int64_t row = s.heads * s.head_dim;
  return {s.seq * row, s.head_dim, row, 1};
}

}  // namespace

struct CudnnAttention::Impl {
  using Key = std::array<int64_t, 9>;

  Impl(Backend& owner, private_buffers::DeviceFacts* recorded) : backend(owner), facts(recorded) {
    MXTRAIN_CUDNN_CHECK(cudnnCreate(&handle));
    cudaDeviceProp props{};
    int device = 0;
    MXTRAIN_CUDA_CHECK(cudaGetDevice(&device));
    MXTRAIN_CUDA_CHECK(cudaGetDeviceProperties(&props, device));
    capability = props.major * 10 + props.minor;
    gpu_name = props.name;
  }
  ~Impl() {
    graphs.clear();
    if (handle) cudnnDestroy(handle);
  }

  void check(fe::error_object status, const AttentionShape& shape, const char* stage) {
    if (status.is_good()) return;
    const std::string message = status.get_message();
    if (std::strcmp(stage, "execute") == 0)
      throw Error(ErrorKind::system, "cuDNN SDPA failed to run for " + shape_text(shape) + ": " + message,
                  "check that the cuDNN library found at run time matches the one mxtrain was built with");
    unsupported_shape(shape, std::string("cuDNN rejected the graph at ") + stage + ": " + message);
  }

  void check_rules(const AttentionShape& shape) const {
    if (shape.heads % shape.kv_heads != 0) unsupported_shape(shape, "heads must be a multiple of kv_heads");
    if (shape.head_dim % 8 != 0) unsupported_shape(shape, "head_dim must be a multiple of 8");
    const int64_t max_head_dim = capability >= 100 ? 128 : 256;
    if (shape.head_dim > max_head_dim)
      unsupported_shape(shape, strf("head_dim must be at most %lld on compute capability %d",
                                    static_cast<long long>(max_head_dim), capability));
    if (capability < 80) unsupported_shape(shape, strf("flash attention needs compute capability 8.0+, got %d", capability));
  }

  std::shared_ptr<fe::graph::Graph> graph_for(const AttentionShape& shape, DType io, bool backward) {
    const float scale = softmax_scale(shape);
    uint32_t scale_bits;
    std::memcpy(&scale_bits, &scale, 4);
    Key key{shape.batch, shape.seq, shape.heads, shape.kv_heads, shape.head_dim, scale_bits, static_cast<int64_t>(io),
            backward, backward && deterministic};
    auto found = graphs.find(key);
    if (found != graphs.end()) return found->second;
    check_rules(shape);

    const fe::DataType_t io_type = io == DType::f16 ? fe::DataType_t::HALF : fe::DataType_t::BFLOAT16;
    auto graph = std::make_shared<fe::graph::Graph>();
    graph->set_io_data_type(io_type)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    const int64_t B = shape.batch, T = shape.seq, H = shape.heads, KV = shape.kv_heads, D = shape.head_dim;
    const auto qkv_strides = packed_qkv_strides(shape);
    const auto o_strides = output_strides(shape);
    auto tensor = [&](const char* name, Uid uid, std::vector<int64_t> dims, std::vector<int64_t> strides) {
      return graph->tensor(
          fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(std::move(dims)).set_stride(std::move(strides)));
    };
    auto q = tensor("Q", kQ, {B, H, T, D}, qkv_strides);
    auto k = tensor("K", kK, {B, KV, T, D}, qkv_strides);
    auto v = tensor("V", kV, {B, KV, T, D}, qkv_strides);
    if (!backward) {
      auto options = fe::graph::SDPA_attributes()
                         .set_name("attention_forward")
                         .set_generate_stats(true)
                         .set_causal_mask(true)
                         .set_attn_scale(scale);
      auto [o, stats] = graph->sdpa(q, k, v, options);
      o->set_output(true).set_dim({B, H, T, D}).set_stride(o_strides).set_uid(kO);
      stats->set_output(true).set_data_type(fe::DataType_t::FLOAT).set_dim({B, H, T, 1}).set_stride({H * T, T, 1, 1}).set_uid(kStats);
    } else {
      auto o = tensor("O", kO, {B, H, T, D}, o_strides);
      auto d_o = tensor("dO", kDO, {B, H, T, D}, o_strides);
      auto stats = graph->tensor(fe::graph::Tensor_attributes()
                                     .set_name("Stats")
                                     .set_uid(kStats)
                                     .set_dim({B, H, T, 1})
                                     .set_stride({H * T, T, 1, 1})
                                     .set_data_type(fe::DataType_t::FLOAT));
      auto options = fe::graph::SDPA_backward_attributes()
                         .set_name("attention_backward")
                         .set_causal_mask(true)
                         .set_attn_scale(scale)
                         .set_deterministic_algorithm(deterministic);
      auto [dq, dk, dv] = graph->sdpa_backward(q, k, v, o, d_o, stats, options);
      dq->set_output(true).set_dim({B, H, T, D}).set_stride(qkv_strides).set_uid(kDQ);
      dk->set_output(true).set_dim({B, KV, T, D}).set_stride(qkv_strides).set_uid(kDK);
      dv->set_output(true).set_dim({B, KV, T, D}).set_stride(qkv_strides).set_uid(kDV);
    }
    check(graph->validate(), shape, "validate");
    check(graph->build_operation_graph(handle), shape, "build_operation_graph");
    check(graph->create_execution_plans({fe::HeurMode_t::A}), shape, "create_execution_plans");
    check(graph->check_support(handle), shape, "check_support");
    check(graph->build_plans(handle), shape, "build_plans");
    int64_t bytes = 0;
    check(graph->get_workspace_size(bytes), shape, "get_workspace_size");
    log::debug(strf("cuDNN SDPA %s graph for %s: workspace %lld bytes", backward ? "backward" : "forward",
                    shape_text(shape).c_str(), static_cast<long long>(bytes)));
    graphs.emplace(key, graph);
    return graph;
  }

  void* workspace_for(const std::shared_ptr<fe::graph::Graph>& graph, const AttentionShape& shape, DType io,
                      bool backward) {
    int64_t bytes = 0;
    check(graph->get_workspace_size(bytes), shape, "get_workspace_size");
    if (facts)
      facts->record(private_buffers::attention_workspace_fact(shape, io, backward, backward && deterministic), bytes);
    return workspace_of(bytes);
  }

  // The one workspace, grown to `bytes` when it holds less.
  void* workspace_of(int64_t bytes) {
    if (auto grown = private_buffers::attention_workspace(workspace_size, bytes)) {
      workspace.reset();
      workspace = private_buffers::allocate_private(backend, *grown);
      workspace_size = grown->bytes();
    }
    return workspace_size > 0 ? workspace.tensor().data : nullptr;
  }

  void execute(const std::shared_ptr<fe::graph::Graph>& graph, std::unordered_map<int64_t, void*>& pack,
               const AttentionShape& shape, DType io, bool backward, cudaStream_t stream) {
    void* space = workspace_for(graph, shape, io, backward);
    MXTRAIN_CUDNN_CHECK(cudnnSetStream(handle, stream));
    check(graph->execute(handle, pack, space), shape, "execute");
  }

  void note_f32() {
    if (warned_f32) return;
    warned_f32 = true;
    log::info("cuda attention: f32 activations run cuDNN's bf16 flash attention (cuDNN has no f32 SDPA): "
              "q, k, v and dout are rounded to bf16, outputs widened back to f32");
  }

  Backend& backend;
  private_buffers::DeviceFacts* facts = nullptr;
  cudnnHandle_t handle = nullptr;
  bool deterministic = false;
  bool flash_attention_4 = false;  // the backward through flash_attention_4.hpp
  int capability = 0;              // of the device the backend was created on
  std::string gpu_name;
  bool warned_f32 = false;
  std::map<Key, std::shared_ptr<fe::graph::Graph>> graphs;
  Buffer workspace;
  size_t workspace_size = 0;
};

CudnnAttention::CudnnAttention(Backend& backend, private_buffers::DeviceFacts* facts)
    : impl_(std::make_unique<Impl>(backend, facts)) {}
CudnnAttention::~CudnnAttention() = default;
void CudnnAttention::set_deterministic(bool deterministic) { impl_->deterministic = deterministic; }
bool CudnnAttention::deterministic() const { return impl_->deterministic; }
size_t CudnnAttention::workspace_bytes() const { return impl_->workspace_size; }
void CudnnAttention::set_flash_attention_4_backward(bool enabled) {
  if (enabled && flash_attention_4::carried().empty())
    throw Error(ErrorKind::config,
                "train.attention_backward = flash-attention-4, but " +
                    flash_attention_4::unsupported(AttentionShape{}, DType::bf16),
                "set train.attention_backward = cudnn, or build with the kernels");
  impl_->flash_attention_4 = enabled;
}
bool CudnnAttention::flash_attention_4_backward() const { return impl_->flash_attention_4; }

void CudnnAttention::check_backward(const AttentionShape& shape, DType io) const {
  if (!impl_->flash_attention_4) return;
  if (impl_->deterministic)
    throw Error(ErrorKind::config,
                "train.attention_backward = flash-attention-4 with train.deterministic: FlashAttention-4's backward "
                "sums dQ with atomics, so its gradients are not bit-reproducible",
                "set train.attention_backward = cudnn (cuDNN's deterministic backward), or train.deterministic = false");
  if (impl_->capability != 90)
    throw Error(ErrorKind::unsupported,
                strf("train.attention_backward = flash-attention-4 on the %s (sm_%d): its kernels are compiled for "
                     "Hopper (sm_90a) only",
                     impl_->gpu_name.c_str(), impl_->capability),
                "set train.attention_backward = cudnn for this GPU");
  const std::string why = flash_attention_4::unsupported(shape, io);
  if (!why.empty())
    throw Error(ErrorKind::unsupported,
                "train.attention_backward = flash-attention-4 cannot run attention with " + shape_text(shape) + ": " +
                    why,
                "set train.attention_backward = cudnn");
}

void CudnnAttention::forward(const Tensor& qkv, const Tensor& out, const Tensor& lse, const AttentionShape& shape,
                             cudaStream_t stream) {
  MXTRAIN_ASSERT(qkv.is_contiguous() && out.is_contiguous() && lse.is_contiguous(), "attention_forward: layouts");
  MXTRAIN_ASSERT(out.dtype == qkv.dtype, "attention_forward: qkv %s, out %s", qkv.describe().c_str(),
                 out.describe().c_str());
  if (qkv.dtype == DType::f32) {
    impl_->note_f32();
    std::vector<Buffer> staging =
        private_buffers::allocate_private(impl_->backend, private_buffers::attention_forward(qkv, out));
    const Tensor& qkv16 = staging.at(0).tensor();
    const Tensor& out16 = staging.at(1).tensor();
    cuda_kernels::convert(qkv, qkv16, stream);
    forward(qkv16, out16, lse, shape, stream);
    cuda_kernels::convert(out16, out, stream);
    return;
  }
  if (qkv.dtype != DType::bf16 && qkv.dtype != DType::f16)
    unsupported_shape(shape, "activations must be bf16, f16 or f32, got " + std::string(dtype_name(qkv.dtype)));
  auto graph = impl_->graph_for(shape, qkv.dtype, false);
  const int64_t element = dtype_bits(qkv.dtype) / 8;
  char* base = static_cast<char*>(qkv.data);
  std::unordered_map<int64_t, void*> pack{
      {kQ, base},
      {kK, base + shape.heads * shape.head_dim * element},
      {kV, base + (shape.heads + shape.kv_heads) * shape.head_dim * element},
      {kO, out.data},
      {kStats, lse.data}};
  impl_->execute(graph, pack, shape, qkv.dtype, false, stream);
}

void CudnnAttention::backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                              const Tensor& dqkv, const AttentionShape& shape, cudaStream_t stream) {
  MXTRAIN_ASSERT(dout.is_contiguous() && qkv.is_contiguous() && out.is_contiguous() && lse.is_contiguous() &&
                     dqkv.is_contiguous(),
                 "attention_backward: layouts");
  MXTRAIN_ASSERT(dout.dtype == qkv.dtype && out.dtype == qkv.dtype && dqkv.dtype == qkv.dtype,
                 "attention_backward: dtypes of dout %s, qkv %s, out %s, dqkv %s differ", dout.describe().c_str(),
                 qkv.describe().c_str(), out.describe().c_str(), dqkv.describe().c_str());
  if (qkv.dtype == DType::f32) {
    impl_->note_f32();
    std::vector<Buffer> staging = private_buffers::allocate_private(
        impl_->backend, private_buffers::attention_backward(dout, qkv, out, dqkv));
    const Tensor& dout16 = staging.at(0).tensor();
    const Tensor& qkv16 = staging.at(1).tensor();
    const Tensor& out16 = staging.at(2).tensor();
    const Tensor& dqkv16 = staging.at(3).tensor();
    cuda_kernels::convert(dout, dout16, stream);
    cuda_kernels::convert(qkv, qkv16, stream);
    cuda_kernels::convert(out, out16, stream);
    backward(dout16, qkv16, out16, lse, dqkv16, shape, stream);
    cuda_kernels::convert(dqkv16, dqkv, stream);
    return;
  }
  if (qkv.dtype != DType::bf16 && qkv.dtype != DType::f16)
    unsupported_shape(shape, "activations must be bf16, f16 or f32, got " + std::string(dtype_name(qkv.dtype)));
  if (impl_->flash_attention_4) {
    // cuDNN's forward, FlashAttention-4's backward from its O and statistics (flash_attention_4.hpp).
    check_backward(shape, qkv.dtype);
    void* space = impl_->workspace_of(private_buffers::flash_attention_4_workspace(shape).bytes());
    flash_attention_4::backward(dout, qkv, out, lse, dqkv, shape, softmax_scale(shape), space, stream);
    return;
  }
  auto graph = impl_->graph_for(shape, qkv.dtype, true);
  const int64_t element = dtype_bits(qkv.dtype) / 8;
  const int64_t k_offset = shape.heads * shape.head_dim * element;
  const int64_t v_offset = (shape.heads + shape.kv_heads) * shape.head_dim * element;
  char* base = static_cast<char*>(qkv.data);
  char* grad = static_cast<char*>(dqkv.data);
  std::unordered_map<int64_t, void*> pack{
      {kQ, base},           {kK, base + k_offset}, {kV, base + v_offset}, {kO, out.data},
      {kDO, dout.data},     {kStats, lse.data},    {kDQ, grad},           {kDK, grad + k_offset},
      {kDV, grad + v_offset}};
  impl_->execute(graph, pack, shape, qkv.dtype, true, stream);
}

}  // namespace mxtrain
