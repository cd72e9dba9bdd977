#include "mxtrain/backend/cuda/quack_gemm.hpp"

#include <iterator>

#include "mxtrain/backend/cuda/cuda_check.hpp"
#include "mxtrain/core/error.hpp"

#if MXTRAIN_HAVE_QUACK_GEMMS
#include <tvm/ffi/extra/c_env_api.h>

#include <map>

#include "mxtrain/backend/cuda/tvm_ffi_call.hpp"

// The exported functions (scripts/quack_gemm_export.py): __tvm_ffi_mxtrain_quack_<layout>_<config>,
// listed by the generated table as MXTRAIN_QUACK_GEMM(layout, config, tile_m, tile_n, cluster_m,
// cluster_n, pingpong).
#define MXTRAIN_QUACK_GEMM(layout, config, tile_m, tile_n, cluster_m, cluster_n, pingpong) \
  int __tvm_ffi_mxtrain_quack_##layout##_##config(void*, const TVMFFIAny*, int32_t, TVMFFIAny*);
extern "C" {
#include "mxtrain/quack_gemm_kernels.inc"
}
#undef MXTRAIN_QUACK_GEMM
#endif

namespace mxtrain::quack_gemm {

#if MXTRAIN_HAVE_QUACK_GEMMS
namespace {

struct Kernel {
  const char* layout;
  const char* config;
  int64_t tile_m, tile_n, cluster_m, cluster_n, pingpong;
  tvm_ffi::Packed fn;
};

#define MXTRAIN_QUACK_GEMM(layout, config, tile_m, tile_n, cluster_m, cluster_n, pingpong) \
  Kernel{#layout, #config, tile_m, tile_n, cluster_m, cluster_n, pingpong, __tvm_ffi_mxtrain_quack_##layout##_##config},
const Kernel kKernels[] = {
#include "mxtrain/quack_gemm_kernels.inc"
};
#undef MXTRAIN_QUACK_GEMM

// cuBLAS's transposes as the layout tag the export names them by (the three linear ops).
const char* layout_of(const Product& p) {
  if (p.transpose_a && !p.transpose_b) return "tn";  // forward: x · Wᵀ
  if (!p.transpose_a && !p.transpose_b) return "nn";  // input gradient: dY · W
  if (!p.transpose_a && p.transpose_b) return "nt";   // weight gradient: dYᵀ · x
  return nullptr;
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

struct Device {
  int id = 0, sms = 0;
  bool hopper = false;
};

const Device& device() {
  thread_local std::map<int, Device> devices;
  int id = 0;
  MXTRAIN_CUDA_CHECK(cudaGetDevice(&id));
  auto found = devices.find(id);
  if (found != devices.end()) return found->second;
  Device d;
  d.id = id;
  int major = 0, minor = 0;
  MXTRAIN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, id));
  MXTRAIN_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, id));
  MXTRAIN_CUDA_CHECK(cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, id));
  d.hopper = major == 9 && minor == 0;  // the kernels are sm_90a code
  return devices.emplace(id, d).first->second;
}

[[noreturn]] void fail(const std::string& what) {
  throw Error(ErrorKind::system, "quack's GEMM: " + what,
              "set train.gemm_kernels = cublaslt (the default: cuBLASLt only), and report this with the log");
}

// The plain epilogue's twelve absent arguments, and the tile scheduler's (clusters that fit,
// raster order, swizzle, semaphore, all-gather, batch permutation): arrays made once and kept.
TVMFFIAny epilogue_arguments() {
  static TVMFFIAny made = [] {
    TVMFFIAny array, elements[12];
    for (TVMFFIAny& e : elements) e = tvm_ffi::none();
    const std::string error = tvm_ffi::make_array(elements, 12, &array);
    if (!error.empty()) fail("TVM-FFI's ffi.Array failed: " + error);
    return array;
  }();
  return made;
}

TVMFFIAny scheduler_arguments(int64_t clusters) {
  thread_local std::map<int64_t, TVMFFIAny> made;
  auto found = made.find(clusters);
  if (found != made.end()) return found->second;
  TVMFFIAny array, elements[6] = {tvm_ffi::integer(clusters), tvm_ffi::none(), tvm_ffi::integer(8),
                                  tvm_ffi::none(), tvm_ffi::none(), tvm_ffi::none()};
  const std::string error = tvm_ffi::make_array(elements, 6, &array);
  if (!error.empty()) fail("TVM-FFI's ffi.Array failed: " + error);
  return made.emplace(clusters, array).first->second;
}

// The stream and the number of clusters that fit, for a call of `kernel`.
int64_t prepare_call(const Kernel& kernel, const std::string& what, cudaStream_t stream) {
  const Device& dev = device();
  if (TVMFFIEnvSetStream(kDLCUDA, dev.id, stream, nullptr) != 0)
    fail("TVM-FFI could not take mxtrain's CUDA stream for " + what + ": " + tvm_ffi::raised_error());
  return dev.sms / (kernel.cluster_m * kernel.cluster_n);
}

// The carried functions of `layout`, as indexes into kKernels in the export's order.
std::vector<int> kernels_of(const char* layout) {
  std::vector<int> found;
  for (int i = 0; i < static_cast<int>(std::size(kKernels)); ++i)
    if (std::string(kKernels[i].layout) == layout) found.push_back(i);
  return found;
}

}  // namespace

std::vector<std::string> carried() {
  std::vector<std::string> names;
  for (const Kernel& k : kKernels) names.push_back(std::string(k.layout) + " " + k.config);
  return names;
}

bool gated_carried() { return !kernels_of("gated").empty(); }

std::vector<int> gated_candidates(const Gated& g) {
  if (g.rows <= 0 || g.k <= 0 || g.ffn <= 0 || g.k % 8 || g.ffn % 8 || !device().hopper) return {};
  if (!aligned16(g.x) || !aligned16(g.w) || !aligned16(g.preact) || !aligned16(g.postact)) return {};
  return kernels_of("gated");
}

void run_gated(int candidate, const Gated& g, cudaStream_t stream) {
  const Kernel& kernel = kKernels[candidate];
  const int64_t clusters = prepare_call(kernel, name(candidate), stream);
  const int id = device().id;
  using tvm_ffi::View;
  View x(const_cast<void*>(g.x), tvm_ffi::kBf16, id, {g.rows, g.k}, {g.k, 1});
  View w(const_cast<void*>(g.w), tvm_ffi::kBf16, id, {g.k, 2 * g.ffn}, {1, g.k});  // quack's B [k, 2F] = wᵀ
  View preact(g.preact, tvm_ffi::kBf16, id, {g.rows, 2 * g.ffn}, {2 * g.ffn, 1});
  View postact(g.postact, tvm_ffi::kBf16, id, {g.rows, g.ffn}, {g.ffn, 1});
  // The epilogue's (postact, None, None): postact goes in as an ffi.Tensor over the view.
  tvm_ffi::TensorArray epilogue({postact.any(), tvm_ffi::none(), tvm_ffi::none()}, {&postact});
  if (!epilogue.error.empty()) fail("TVM-FFI could not make the gated GEMM's epilogue arguments: " + epilogue.error);
  const TVMFFIAny n = tvm_ffi::none();
  const std::string error = tvm_ffi::call(
      kernel.fn, {x.any(), w.any(), preact.any(), n, epilogue.any, scheduler_arguments(clusters), n, n, n});
  if (!error.empty()) fail(name(candidate) + " failed: " + error);
}

bool gelu_carried() {
  return !kernels_of("gelu").empty() && !kernels_of("dgelu").empty() && !kernels_of("dgelub").empty();
}

std::vector<int> gelu_candidates(const Gelu& g) {
  if (g.rows <= 0 || g.k <= 0 || g.n <= 0 || g.k % 8 || g.n % 8 || !device().hopper) return {};
  if (!aligned16(g.a) || !aligned16(g.w) || !aligned16(g.preact) || !aligned16(g.out)) return {};
  if (!g.backward && (g.bias == nullptr || !aligned16(g.bias))) return {};
  if (g.bias_partials != nullptr && (!g.backward || !aligned16(g.bias_partials))) return {};
  return kernels_of(!g.backward ? "gelu" : g.bias_partials != nullptr ? "dgelub" : "dgelu");
}

int64_t gelu_partial_rows(int candidate, int64_t rows) {
  const int64_t tile = kKernels[candidate].tile_m;
  return (rows + tile - 1) / tile;
}

void run_gelu(int candidate, const Gelu& g, cudaStream_t stream) {
  const Kernel& kernel = kKernels[candidate];
  const int64_t clusters = prepare_call(kernel, name(candidate), stream);
  const int id = device().id;
  using tvm_ffi::View;
  View a(const_cast<void*>(g.a), tvm_ffi::kBf16, id, {g.rows, g.k}, {g.k, 1});
  View preact(g.preact, tvm_ffi::kBf16, id, {g.rows, g.n}, {g.n, 1});
  View out(g.out, tvm_ffi::kBf16, id, {g.rows, g.n}, {g.n, 1});
  // quack's B [k, n]: the forward's w is [n, k] (B = wᵀ), the backward's w [k, n] row-major.
  const int64_t one = 1;
  View w(const_cast<void*>(g.w), tvm_ffi::kBf16, id, {g.k, g.n}, {g.backward ? g.n : one, g.backward ? one : g.k});
  const TVMFFIAny n = tvm_ffi::none();
  std::string error;
  if (!g.backward) {
    View bias(const_cast<void*>(g.bias), tvm_ffi::kBf16, id, {g.n}, {1});
    // The epilogue's (bias, postact, None, None); D is the pre-activation.
    tvm_ffi::TensorArray epilogue({bias.any(), out.any(), n, n}, {&bias, &out});
    if (!epilogue.error.empty()) fail("TVM-FFI could not make the GELU GEMM's epilogue arguments: " + epilogue.error);
    error = tvm_ffi::call(kernel.fn,
                          {a.any(), w.any(), preact.any(), n, epilogue.any, scheduler_arguments(clusters), n, n, n});
  } else if (g.bias_partials != nullptr) {
    const int64_t tiles = gelu_partial_rows(candidate, g.rows);
    View partials(g.bias_partials, tvm_ffi::kF32, id, {tiles, g.n}, {g.n, 1});
    // The epilogue's (bias partials, None, None); C is the pre-activation, D the gradient.
    tvm_ffi::TensorArray epilogue({partials.any(), n, n}, {&partials});
    if (!epilogue.error.empty())
      fail("TVM-FFI could not make the GELU backward's epilogue arguments: " + epilogue.error);
    error = tvm_ffi::call(kernel.fn, {a.any(), w.any(), out.any(), preact.any(), epilogue.any,
                                      scheduler_arguments(clusters), n, n, n});
  } else {
    TVMFFIAny pair;  // the epilogue's (None, None); C is the pre-activation, D the gradient
    const std::string made = tvm_ffi::make_none_pair(&pair);
    if (!made.empty()) fail("TVM-FFI could not make the GELU backward's epilogue arguments: " + made);
    error = tvm_ffi::call(kernel.fn, {a.any(), w.any(), out.any(), preact.any(), pair, scheduler_arguments(clusters),
                                      n, n, n});
    if (pair.type_index >= kTVMFFIStaticObjectBegin) TVMFFIObjectDecRef(pair.v_obj);
  }
  if (!error.empty()) fail(name(candidate) + " failed: " + error);
}

std::vector<int> candidates(const Product& p) {
  const char* layout = layout_of(p);
  if (layout == nullptr || p.m <= 0 || p.n <= 0 || p.k <= 0 || !device().hopper) return {};
  // TMA: 16-byte aligned bases and leading dimensions that are multiples of 16 bytes.
  if (!aligned16(p.a) || !aligned16(p.b) || !aligned16(p.d) || p.lda % 8 || p.ldb % 8 || p.ldd % 8) return {};
  return kernels_of(layout);
}

std::string name(int candidate) {
  const Kernel& k = kKernels[candidate];
  return std::string("quack ") + k.layout + " " + k.config;
}

void run(int candidate, const Product& p, cudaStream_t stream) {
  const Kernel& kernel = kKernels[candidate];
  const int64_t clusters = prepare_call(kernel, name(candidate), stream);
  const Device& dev = device();
  // cuBLAS's column-major D[m, n] = op(A) · op(B) is row-major D[n, m] = op(B)ᵀ · op(A)ᵀ: quack's
  // A [n, k] is cuBLAS's B, its B [k, m] cuBLAS's A, each read in the order its transpose says.
  using tvm_ffi::View;
  const int64_t one = 1;
  View a(const_cast<void*>(p.b), tvm_ffi::kBf16, dev.id, {p.n, p.k},
         {p.transpose_b ? one : p.ldb, p.transpose_b ? p.ldb : one});
  View b(const_cast<void*>(p.a), tvm_ffi::kBf16, dev.id, {p.k, p.m},
         {p.transpose_a ? one : p.lda, p.transpose_a ? p.lda : one});
  View d(p.d, tvm_ffi::kBf16, dev.id, {p.n, p.m}, {p.ldd, 1});
  const TVMFFIAny n = tvm_ffi::none();
  const std::string error = tvm_ffi::call(
      kernel.fn, {a.any(), b.any(), d.any(), n, epilogue_arguments(), scheduler_arguments(clusters), n, n, n});
  if (!error.empty()) fail(name(candidate) + " failed: " + error);
}

// ---- the linear cross-entropy -------------------------------------------------------------------

namespace {

// The carried function of `layout` whose column tile is `tile_n`; -1 when none.
int find_kernel(const char* layout, int64_t tile_n = 0) {
  for (int i = 0; i < static_cast<int>(std::size(kKernels)); ++i)
    if (std::string(kKernels[i].layout) == layout && (tile_n == 0 || kKernels[i].tile_n == tile_n)) return i;
  return -1;
}

// The gradient GEMMs' column tile over the hidden size: 192 where it divides it, else 256.
int64_t lce_grad_tile(int64_t hidden) { return hidden % 192 == 0 ? 192 : 256; }

constexpr DLDataType kI32{kDLInt, 32, 1};

void call_or_fail(int kernel, std::initializer_list<TVMFFIAny> args) {
  const std::string error = tvm_ffi::call(kKernels[kernel].fn, args);
  if (!error.empty()) fail(name(kernel) + " failed: " + error);
}

}  // namespace

bool lce_carried() {
  for (int64_t n : {int64_t{192}, int64_t{256}})
    if (find_kernel("lce_dx", n) < 0 || find_kernel("lce_dw", n) < 0 || find_kernel("lce_dwadd", n) < 0) return false;
  return find_kernel("lce_fwd", 192) >= 0 && find_kernel("lce_fwd", 256) >= 0;
}

std::string lce_unsupported(const LinearCrossEntropy& c) {
  if (!lce_carried()) return "this build does not carry quack's linear cross-entropy (rerun scripts/fa4_kernels.sh)";
  if (!device().hopper) return "quack's kernels are sm_90a code and this GPU is not an sm_90 one";
  if (c.rows <= 0 || c.rows % 128) return "rows must be a positive multiple of 128";
  if (c.tile != 192 && c.tile != 256) return "the forward's tile must be 192 or 256 columns";
  if (c.vocab % c.tile || c.vocab % 128) return "the padded vocabulary must be a multiple of 128 and of the tile";
  if (c.hidden <= 0 || c.hidden % 8) return "the hidden size must be a multiple of 8";
  if (c.partials_ld < c.vocab / c.tile || c.partials_ld % 4) return "the partials' leading dimension";
  const std::initializer_list<const void*> pointers = {c.x, c.weight, c.e, c.strip, c.xs, c.dx, c.dweight,
                                                       c.mask, c.sum_exp, c.offsets};
  for (const void* p : pointers)
    if (p != nullptr && !aligned16(p)) return "operands must be 16-byte aligned";
  return "";
}

void lce_forward(const LinearCrossEntropy& c, cudaStream_t stream) {
  const int kernel = find_kernel("lce_fwd", c.tile);
  const int64_t clusters = prepare_call(kKernels[kernel], name(kernel), stream);
  const int id = device().id;
  const int64_t tiles = c.vocab / c.tile;
  using tvm_ffi::View;
  View x(const_cast<void*>(c.x), tvm_ffi::kBf16, id, {c.rows, c.hidden}, {c.hidden, 1});
  View w(const_cast<void*>(c.weight), tvm_ffi::kBf16, id, {c.vocab, c.hidden}, {c.hidden, 1});
  View e(c.e, tvm_ffi::kBf16, id, {c.rows, c.vocab}, {c.vocab, 1});
  View mask(const_cast<float*>(c.mask), tvm_ffi::kF32, id, {1, c.vocab}, {c.vocab, 1});
  View sum_exp(c.sum_exp, tvm_ffi::kF32, id, {c.rows, tiles}, {c.partials_ld, 1});
  View target_logits(c.target_logits, tvm_ffi::kF32, id, {c.rows}, {1});
  View offsets(c.offsets, tvm_ffi::kF32, id, {c.rows, tiles}, {c.partials_ld, 1});
  View targets(const_cast<int32_t*>(c.targets), kI32, id, {c.rows}, {1});
  const TVMFFIAny n = tvm_ffi::none();
  // (the tile width, compiled in; mask; sum_exp; target_logit; max_log2_out; target; None; None)
  tvm_ffi::TensorArray epilogue({n, mask.any(), sum_exp.any(), target_logits.any(), offsets.any(), targets.any(), n, n},
                                {&mask, &sum_exp, &target_logits, &offsets, &targets});
  if (!epilogue.error.empty()) fail("TVM-FFI could not make the linear cross-entropy's arguments: " + epilogue.error);
  call_or_fail(kernel, {x.any(), w.any(), e.any(), n, epilogue.any, scheduler_arguments(clusters), n, n, n});
}

void lce_input_grad(const LinearCrossEntropy& c, cudaStream_t stream) {
  const int kernel = find_kernel("lce_dx", lce_grad_tile(c.hidden));
  const int64_t clusters = prepare_call(kKernels[kernel], name(kernel), stream);
  const int id = device().id;
  using tvm_ffi::View;
  // A = (E [rows, vocab], the strip as the (row, 64-column block) scale's view: 128 rows a box).
  View e(c.e, tvm_ffi::kBf16, id, {c.rows, c.vocab}, {c.vocab, 1});
  View strip(const_cast<void*>(c.strip), tvm_ffi::kBf16, id, {128, 1, c.rows / 128, c.vocab / 64, 1},
             {1, c.rows, 128, c.rows, 1});
  tvm_ffi::TensorArray a({e.any(), strip.any()}, {&e, &strip});
  View w(const_cast<void*>(c.weight), tvm_ffi::kBf16, id, {c.hidden, c.vocab}, {1, c.hidden});  // Wᵀ's view
  View dx(c.dx, tvm_ffi::kBf16, id, {c.rows, c.hidden}, {c.hidden, 1});
  View v(const_cast<float*>(c.row_scale), tvm_ffi::kF32, id, {1, c.rows}, {c.rows, 1});
  const TVMFFIAny n = tvm_ffi::none();
  tvm_ffi::TensorArray epilogue({v.any(), n, n}, {&v});
  if (!a.error.empty() || !epilogue.error.empty())
    fail("TVM-FFI could not make the linear cross-entropy's arguments: " + a.error + epilogue.error);
  call_or_fail(kernel, {a.any, w.any(), dx.any(), n, epilogue.any, scheduler_arguments(clusters), n, n, n});
}

void lce_weight_grad(const LinearCrossEntropy& c, bool accumulate, cudaStream_t stream) {
  const int kernel = find_kernel(accumulate ? "lce_dwadd" : "lce_dw", lce_grad_tile(c.hidden));
  const int64_t clusters = prepare_call(kKernels[kernel], name(kernel), stream);
  const int id = device().id;
  using tvm_ffi::View;
  // A = (Eᵀ [vocab, rows], the strip as the (64-column block, row) scale's view).
  View et(c.e, tvm_ffi::kBf16, id, {c.vocab, c.rows}, {1, c.vocab});
  View strip(const_cast<void*>(c.strip), tvm_ffi::kBf16, id, {64, 2, c.vocab / 128, c.rows / 64, 1},
             {1, c.rows, 2 * c.rows, 64, 1});
  tvm_ffi::TensorArray a({et.any(), strip.any()}, {&et, &strip});
  View xs(const_cast<void*>(c.xs), tvm_ffi::kBf16, id, {c.hidden, c.rows}, {1, c.hidden});  // xsᵀ's view
  View dw(c.dweight, tvm_ffi::kF32, id, {c.vocab, c.hidden}, {c.hidden, 1});
  TVMFFIAny pair;
  const std::string made = tvm_ffi::make_none_pair(&pair);
  if (!a.error.empty() || !made.empty())
    fail("TVM-FFI could not make the linear cross-entropy's arguments: " + a.error + made);
  const TVMFFIAny n = tvm_ffi::none();
  call_or_fail(kernel, {a.any, xs.any(), dw.any(), n, pair, scheduler_arguments(clusters), n, n, n});
  if (pair.type_index >= kTVMFFIStaticObjectBegin) TVMFFIObjectDecRef(pair.v_obj);
}

#else  // built without the kernel folder

std::vector<std::string> carried() { return {}; }
std::vector<int> candidates(const Product&) { return {}; }
std::string name(int) { return ""; }
void run(int, const Product&, cudaStream_t) {
  throw Error(ErrorKind::internal, "quack_gemm::run in a build without quack's GEMMs", "");
}
bool gated_carried() { return false; }
std::vector<int> gated_candidates(const Gated&) { return {}; }
void run_gated(int, const Gated&, cudaStream_t) {
  throw Error(ErrorKind::internal, "quack_gemm::run_gated in a build without quack's GEMMs", "");
}
bool gelu_carried() { return false; }
std::vector<int> gelu_candidates(const Gelu&) { return {}; }
void run_gelu(int, const Gelu&, cudaStream_t) {
  throw Error(ErrorKind::internal, "quack_gemm::run_gelu in a build without quack's GEMMs", "");
}
int64_t gelu_partial_rows(int, int64_t) { return 0; }
bool lce_carried() { return false; }
std::string lce_unsupported(const LinearCrossEntropy&) {
  return "this build does not carry quack's kernels (configure with -DMXTRAIN_FLASH_ATTENTION_4=<folder>)";
}
void lce_forward(const LinearCrossEntropy&, cudaStream_t) {
  throw Error(ErrorKind::internal, "quack_gemm::lce_forward in a build without quack's GEMMs", "");
}
void lce_input_grad(const LinearCrossEntropy&, cudaStream_t) {
  throw Error(ErrorKind::internal, "quack_gemm::lce_input_grad in a build without quack's GEMMs", "");
}
void lce_weight_grad(const LinearCrossEntropy&, bool, cudaStream_t) {
  throw Error(ErrorKind::internal, "quack_gemm::lce_weight_grad in a build without quack's GEMMs", "");
}

#endif

}  // namespace mxtrain::quack_gemm
