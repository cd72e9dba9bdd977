// quack's BF16 GEMMs as GEMM-autotune candidates (backend/cuda/quack_gemm.hpp): with
// MXT_TEST_GEMM_QUACK_ONLY set, the autotune times only quack's configurations wherever they can
// run a GEMM, so the three linear ops (forward x · Wᵀ, input gradient dY · W, weight gradient
// dYᵀ · x) go through quack's kernels from the backend's own gemm(); each result is checked
// against the CPU oracle and against cuBLASLt's, at shapes that are and are not whole tiles, and
// at one whose leading dimension quack cannot take (the autotune keeps cuBLASLt there). Without
// the kernels in the build (a folder from scripts/fa4_kernels.sh), the quack cases are skipped.
//
// Tolerance (relative L2 against the oracle, which sums in FP64 and rounds once): 1e-2, the BF16
// output's rounding (about 3e-3) with room for the K-sums' order.
#include <cstdlib>

#include "cuda/cuda_test_support.hpp"
#include "mxtrain/backend/cuda/cuda_check.hpp"
#include "mxtrain/backend/cuda/quack_gemm.hpp"
#include "mxtrain/backend/private_buffers.hpp"

namespace mxtrain::test {
namespace {

struct GemmCase {
  int64_t rows, in, out;  // tokens, input features, output features
};

class CudaQuackGemm : public CudaTest, public ::testing::WithParamInterface<GemmCase> {
 protected:
  // A backend whose GEMM autotune is on; with `quack_only`, only quack's configurations compete
  // where they can run.
  std::unique_ptr<Backend> tuned_backend(bool quack_only) {
    if (quack_only)
      setenv("MXT_TEST_GEMM_QUACK_ONLY", "1", 1);
    else
      unsetenv("MXT_TEST_GEMM_QUACK_ONLY");
    BackendOptions options;
    options.deterministic = true;
    options.gemm_autotune = true;
    options.gemm_quack = quack_only;
    return create_backend("cuda", options);
  }
};

TEST(CudaQuackGemmBuild, ListsWhatItCarries) {
  const std::vector<std::string> carried = quack_gemm::carried();
  std::string list;
  for (const std::string& name : carried) list += " [" + name + "]";
  std::printf("[ info  ] quack GEMMs in this build:%s\n", list.empty() ? " none" : list.c_str());
  // Every carried function is one of the three layouts the linear ops map to, the gated GEMM, the
  // GELU GEMMs (the backward with and without the bias partials), or one of the linear
  // cross-entropy's three GEMMs.
  for (const std::string& name : carried)
    EXPECT_TRUE(name.rfind("tn ", 0) == 0 || name.rfind("nn ", 0) == 0 || name.rfind("nt ", 0) == 0 ||
                name.rfind("gated ", 0) == 0 || name.rfind("gelu ", 0) == 0 || name.rfind("dgelu ", 0) == 0 ||
                name.rfind("dgelub ", 0) == 0 || name.rfind("lce_fwd ", 0) == 0 || name.rfind("lce_dx ", 0) == 0 ||
                name.rfind("lce_dw ", 0) == 0 || name.rfind("lce_dwadd ", 0) == 0)
        << name;
}

TEST_P(CudaQuackGemm, LinearOpsMatchTheOracleAndCublasLt) {
  const GemmCase c = GetParam();
  const bool built = !quack_gemm::carried().empty();
  const std::vector<float> x = random_as(c.rows * c.in, 11, DType::bf16);
  const std::vector<float> w = random_as(c.out * c.in, 12, DType::bf16, -0.1f, 0.1f);
  const std::vector<float> dy = random_as(c.rows * c.out, 13, DType::bf16);
  const Shape xs{c.rows, c.in}, ws{c.out, c.in}, ys{c.rows, c.out};

  // The oracle.
  Buffer cx = upload(cpu(), x, xs), cw = upload(cpu(), w, ws), cdy = upload(cpu(), dy, ys);
  Buffer cy = cpu().allocate("y", ys, DType::f32, Lifetime::scratch);
  Buffer cdx = cpu().allocate("dx", xs, DType::f32, Lifetime::scratch);
  Buffer cdw = cpu().allocate("dw", ws, DType::f32, Lifetime::scratch);
  cpu().gemm({.role = GemmRole::forward, .a = cx, .b = cw, .out = cy});
  cpu().gemm({.role = GemmRole::backward_input, .a = cdy, .b = cw, .out = cdx});
  cpu().gemm({.role = GemmRole::backward_weight, .a = cdy, .b = cx, .out = cdw});
  const std::vector<float> want[3] = {download(cpu(), cy), download(cpu(), cdx), download(cpu(), cdw)};

  std::vector<float> got[2][3];
  int quack_shapes = 0;
  for (int quack_only = 0; quack_only < 2; ++quack_only) {
    if (quack_only && !built) break;
    std::unique_ptr<Backend> backend = tuned_backend(quack_only == 1);
    Buffer gx = upload(*backend, x, xs, DType::bf16), gw = upload(*backend, w, ws, DType::bf16),
           gdy = upload(*backend, dy, ys, DType::bf16);
    Buffer gy = backend->allocate("y", ys, DType::bf16, Lifetime::scratch);
    Buffer gdx = backend->allocate("dx", xs, DType::bf16, Lifetime::scratch);
    Buffer gdw = backend->allocate("dw", ws, DType::bf16, Lifetime::scratch);
    // Twice: the first call of a shape runs its trials, the second the chosen kernel alone.
    for (int repeat = 0; repeat < 2; ++repeat) {
      backend->gemm({.role = GemmRole::forward, .a = gx, .b = gw, .out = gy});
      backend->gemm({.role = GemmRole::backward_input, .a = gdy, .b = gw, .out = gdx});
      backend->gemm({.role = GemmRole::backward_weight, .a = gdy, .b = gx, .out = gdw});
    }
    got[quack_only][0] = download(*backend, gy);
    got[quack_only][1] = download(*backend, gdx);
    got[quack_only][2] = download(*backend, gdw);
    if (quack_only) quack_shapes = dynamic_cast<CudaBackend&>(*backend).quack_gemm_shapes();
  }
  unsetenv("MXT_TEST_GEMM_QUACK_ONLY");
  const char* names[3] = {"forward x·Wᵀ", "input gradient dY·W", "weight gradient dYᵀ·x"};
  const std::string shape = strf(" %lldx%lld->%lld", static_cast<long long>(c.rows), static_cast<long long>(c.in),
                                 static_cast<long long>(c.out));
  for (int op = 0; op < 3; ++op) {
    EXPECT_LT(report_error(std::string("cuBLASLt ") + names[op] + shape, got[0][op], want[op]), 1e-2);
    if (built) {
      EXPECT_LT(report_error(std::string("quack ") + names[op] + shape, got[1][op], want[op]), 1e-2);
      EXPECT_LT(report_error(std::string("quack against cuBLASLt ") + names[op] + shape, got[1][op], got[0][op]), 1e-2);
    }
  }
  if (!built) GTEST_SKIP() << "built without quack's GEMMs (scripts/fa4_kernels.sh's folder)";
  // Leading dimensions that are multiples of 8 elements: quack takes all three ops; otherwise none.
  const bool aligned = c.in % 8 == 0 && c.out % 8 == 0 && c.rows % 8 == 0;
  EXPECT_EQ(quack_shapes, aligned ? 3 : 0) << "GEMM shapes given to quack's kernels";
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaQuackGemm,
                         ::testing::Values(GemmCase{1000, 520, 776},      // no dimension a whole tile
                                           GemmCase{4096, 2048, 5632},    // llama-1b's up projection, 2 sequences
                                           GemmCase{2048, 5632, 2048},    // its down projection
                                           GemmCase{512, 260, 128}),      // in = 260: rows of 520 bytes, not 16-byte multiples
                         [](const ::testing::TestParamInfo<GemmCase>& info) {
                           return strf("rows%lld_in%lld_out%lld", static_cast<long long>(info.param.rows),
                                       static_cast<long long>(info.param.in), static_cast<long long>(info.param.out));
                         });

// The llama MLP's gate/up forward with SwiGLU in the epilogue (quack's gated GEMM, train.gemm_kernels
// = cublaslt+quack-swiglu): Backend::gemm with swiglu_aux writes the interleaved pre-activation
// and silu(gate) · up. Checked against the CPU oracle (the pre-activation: the BF16 rounding;
// the activation: computed by the kernel from the FP32 product, by the oracle from its FP32 pre)
// and against the same backend's GEMM + SwiGLU kernel. Where the shape does not qualify (k or
// ffn not a multiple of 8) the backend says it does not fuse, and the epilogue runs apart.
struct GatedCase {
  int64_t rows, in, ffn;
};

class CudaQuackSwiglu : public CudaTest, public ::testing::WithParamInterface<GatedCase> {};

TEST_P(CudaQuackSwiglu, FusedForwardMatchesTheOracleAndTheKernel) {
  if (!quack_gemm::gated_carried()) GTEST_SKIP() << "built without quack's gated GEMM (scripts/fa4_kernels.sh's folder)";
  const GatedCase c = GetParam();
  const std::vector<float> x = random_as(c.rows * c.in, 21, DType::bf16);
  const std::vector<float> w = random_as(2 * c.ffn * c.in, 22, DType::bf16, -0.1f, 0.1f);
  const Shape xs{c.rows, c.in}, ws{2 * c.ffn, c.in}, ps{c.rows, 2 * c.ffn}, os{c.rows, c.ffn};
  Buffer cx = upload(cpu(), x, xs), cw = upload(cpu(), w, ws);
  Buffer cpre = cpu().allocate("pre", ps, DType::f32, Lifetime::scratch);
  Buffer cout = cpu().allocate("out", os, DType::f32, Lifetime::scratch);
  cpu().gemm({.role = GemmRole::forward, .a = cx, .b = cw, .out = cout, .epilogue = GemmEpilogue::swiglu_aux,
              .aux = cpre});

  BackendOptions options;
  options.gemm_autotune = true;
  options.gemm_quack_swiglu = true;
  std::unique_ptr<Backend> backend = create_backend("cuda", options);
  const bool qualifies = c.in % 8 == 0 && c.ffn % 8 == 0;
  EXPECT_EQ(backend->gemm_fuses_swiglu(DType::bf16, c.in, c.ffn), qualifies);
  EXPECT_FALSE(backend->gemm_fuses_swiglu(DType::f16, c.in, c.ffn));
  Buffer gx = upload(*backend, x, xs, DType::bf16), gw = upload(*backend, w, ws, DType::bf16);
  Buffer gpre = backend->allocate("pre", ps, DType::bf16, Lifetime::scratch);
  Buffer gout = backend->allocate("out", os, DType::bf16, Lifetime::scratch);
  // Twice: the first call of a shape times the configurations, the second runs the chosen one.
  for (int repeat = 0; repeat < 2; ++repeat)
    backend->gemm({.role = GemmRole::forward, .a = gx, .b = gw, .out = gout, .epilogue = GemmEpilogue::swiglu_aux,
                   .aux = gpre});
  Buffer apart_pre = backend->allocate("pre_apart", ps, DType::bf16, Lifetime::scratch);
  Buffer apart_out = backend->allocate("out_apart", os, DType::bf16, Lifetime::scratch);
  backend->gemm({.role = GemmRole::forward, .a = gx, .b = gw, .out = apart_pre});
  backend->swiglu_forward(apart_pre, apart_out);
  const std::string shape = strf(" %lldx%lld->2x%lld", static_cast<long long>(c.rows), static_cast<long long>(c.in),
                                 static_cast<long long>(c.ffn));
  const std::vector<float> pre = download(*backend, gpre), out = download(*backend, gout);
  EXPECT_LT(report_error("gated pre-activation" + shape, pre, download(cpu(), cpre)), 1e-2);
  EXPECT_LT(report_error("gated activation" + shape, out, download(cpu(), cout)), 1e-2);
  EXPECT_LT(report_error("gated pre-activation against cuBLASLt" + shape, pre, download(*backend, apart_pre)), 1e-2);
  EXPECT_LT(report_error("gated activation against GEMM + kernel" + shape, out, download(*backend, apart_out)), 1e-2);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaQuackSwiglu,
                         ::testing::Values(GatedCase{1000, 520, 392},     // no dimension a whole tile
                                           GatedCase{4096, 2048, 5632},   // llama-1b, 2 sequences
                                           GatedCase{512, 260, 100}),     // not 16-byte rows: apart
                         [](const ::testing::TestParamInfo<GatedCase>& info) {
                           return strf("rows%lld_in%lld_ffn%lld", static_cast<long long>(info.param.rows),
                                       static_cast<long long>(info.param.in), static_cast<long long>(info.param.ffn));
                         });

// GPT-2's MLP GEMMs with GELU in the epilogue (quack's, train.gemm_kernels = cublaslt+quack-gelu):
// the up projection's forward with bias (pre = x · Wᵀ + b, out = gelu(pre) of the FP32 sum) and the
// down projection's input gradient (dx = (dY · W) ⊙ gelu'(pre)). Every carried configuration is
// run directly and checked against the CPU oracle (the autotune may take any of them), then
// Backend::gemm with gelu_aux_bias / dgelu on a backend with quack's GELU on, against the oracle
// and against cuBLASLt's GELU epilogues; the same for the DGELU GEMM that also sums the up
// projection's bias gradient (quack's with its partial sums: each configuration's rows of
// partials summed on the host, and Backend::gemm's bias_gradient added to and overwritten). A shape quack cannot take (k not a multiple of 8) has no
// candidates and runs as before. Tolerance 1e-2 (the BF16 outputs' rounding, the derivative taken
// at the rounded pre-activation by both).
struct GeluCase {
  int64_t rows, model, ffn;
};

class CudaQuackGelu : public CudaTest, public ::testing::WithParamInterface<GeluCase> {};

TEST_P(CudaQuackGelu, ForwardAndBackwardMatchTheOracleAndCublasLt) {
  if (!quack_gemm::gelu_carried()) GTEST_SKIP() << "built without quack's GELU GEMMs (scripts/fa4_kernels.sh's folder)";
  const GeluCase c = GetParam();
  const std::vector<float> x = random_as(c.rows * c.model, 41, DType::bf16, -2.0f, 2.0f);
  const std::vector<float> w_up = random_as(c.ffn * c.model, 42, DType::bf16, -0.1f, 0.1f);
  const std::vector<float> bias = random_as(c.ffn, 43, DType::bf16, -0.5f, 0.5f);
  const std::vector<float> dy = random_as(c.rows * c.model, 44, DType::bf16);
  const std::vector<float> w_down = random_as(c.model * c.ffn, 45, DType::bf16, -0.1f, 0.1f);
  const Shape xs{c.rows, c.model}, us{c.ffn, c.model}, bs{c.ffn}, ds{c.model, c.ffn}, hs{c.rows, c.ffn};

  // The up projection's bias gradient as the DGELU GEMM sums it (an f32 gradient added to).
  const std::vector<float> dbias0 = random_vector(static_cast<size_t>(c.ffn), 46, -1.0f, 1.0f);
  struct Result {
    std::vector<float> pre, out, dx, dx_with_bias, dbias_added, dbias;
  };
  // The forward, then the backward at the forward's own (rounded) pre-activation, without and
  // with the bias gradient.
  auto run = [&](Backend& b, DType dtype) {
    Buffer gx = upload(b, x, xs, dtype), gu = upload(b, w_up, us, dtype), gb = upload(b, bias, bs, dtype);
    Buffer gdy = upload(b, dy, xs, dtype), gd = upload(b, w_down, ds, dtype);
    Buffer pre = b.allocate("pre", hs, dtype, Lifetime::scratch);
    Buffer out = b.allocate("out", hs, dtype, Lifetime::scratch);
    Buffer dx = b.allocate("dx", hs, dtype, Lifetime::scratch);
    Buffer dx2 = b.allocate("dx2", hs, dtype, Lifetime::scratch);
    Buffer dbias = upload(b, dbias0, bs, DType::f32);
    // Twice: the first call of a shape times the configurations, the second runs the chosen one
    // (the bias gradient added to, then overwritten).
    std::vector<float> added;
    for (int repeat = 0; repeat < 2; ++repeat) {
      b.gemm({.role = GemmRole::forward, .a = gx, .b = gu, .out = out, .epilogue = GemmEpilogue::gelu_aux_bias,
              .bias = gb, .aux = pre});
      b.gemm({.role = GemmRole::backward_input, .a = gdy, .b = gd, .out = dx, .epilogue = GemmEpilogue::dgelu,
              .aux = pre});
      b.gemm({.role = GemmRole::backward_input, .a = gdy, .b = gd, .out = dx2, .epilogue = GemmEpilogue::dgelu,
              .bias_gradient = dbias, .bias_gradient_accumulate = repeat == 0, .aux = pre});
      if (repeat == 0) added = download(b, dbias);
    }
    return Result{download(b, pre), download(b, out), download(b, dx), download(b, dx2), added, download(b, dbias)};
  };
  const Result want = run(cpu(), DType::f32);
  const Result cublaslt = run(cuda(), DType::bf16);
  BackendOptions options;
  options.gemm_autotune = true;
  options.gemm_quack_gelu = true;
  std::unique_ptr<Backend> backend = create_backend("cuda", options);
  const Result quack = run(*backend, DType::bf16);
  const std::string shape = strf(" %lldx%lld->%lld", static_cast<long long>(c.rows), static_cast<long long>(c.model),
                                 static_cast<long long>(c.ffn));
  const bool qualifies = c.model % 8 == 0 && c.ffn % 8 == 0;
  EXPECT_EQ(backend->gemm_fuses_dgelu_bias_gradient(DType::bf16, c.model, c.ffn), qualifies);
  EXPECT_FALSE(cuda().gemm_fuses_dgelu_bias_gradient(DType::bf16, c.model, c.ffn));  // cuBLASLt only
  // The bias gradient: inside quack's DGELU GEMM (or, where the autotune takes cuBLASLt's, its
  // column partials), and on the other two backends the column-sum op after the GEMM. On the
  // cuBLASLt backend dx is the same bits with or without it (the same GEMM); with quack's the
  // autotune chooses per kind, so the two may come from different kernels.
  EXPECT_EQ(cublaslt.dx_with_bias, cublaslt.dx);
  EXPECT_LT(report_error("DGELU input gradient with the bias gradient" + shape, quack.dx_with_bias, want.dx), 1e-2);
  EXPECT_LT(report_error("DGELU bias gradient" + shape, quack.dbias, want.dbias), 1e-2);
  EXPECT_LT(report_error("DGELU bias gradient added to" + shape, quack.dbias_added, want.dbias_added), 1e-2);
  EXPECT_LT(report_error("DGELU bias gradient, cuBLASLt and column sum" + shape, cublaslt.dbias, want.dbias), 1e-2);
  EXPECT_LT(report_error("GELU pre-activation" + shape, quack.pre, want.pre), 1e-2);
  EXPECT_LT(report_error("GELU activation" + shape, quack.out, want.out), 1e-2);
  EXPECT_LT(report_error("DGELU input gradient" + shape, quack.dx, want.dx), 1e-2);
  EXPECT_LT(report_error("GELU activation against cuBLASLt" + shape, quack.out, cublaslt.out), 1e-2);
  EXPECT_LT(report_error("DGELU input gradient against cuBLASLt" + shape, quack.dx, cublaslt.dx), 1e-2);

  // Each carried configuration on its own, on the same operands (the backward at the oracle's
  // pre-activation rounded to BF16, so every configuration reads the same input).
  Buffer gx = upload(*backend, x, xs, DType::bf16), gu = upload(*backend, w_up, us, DType::bf16);
  Buffer gb = upload(*backend, bias, bs, DType::bf16), gdy = upload(*backend, dy, xs, DType::bf16);
  Buffer gd = upload(*backend, w_down, ds, DType::bf16), gpre = upload(*backend, want.pre, hs, DType::bf16);
  Buffer pre = backend->allocate("pre", hs, DType::bf16, Lifetime::scratch);
  Buffer out = backend->allocate("out", hs, DType::bf16, Lifetime::scratch);
  quack_gemm::Gelu forward{.backward = false, .rows = c.rows, .k = c.model, .n = c.ffn, .a = gx.tensor().data,
                           .w = gu.tensor().data, .bias = gb.tensor().data, .preact = pre.tensor().data,
                           .out = out.tensor().data};
  quack_gemm::Gelu backward{.backward = true, .rows = c.rows, .k = c.model, .n = c.ffn, .a = gdy.tensor().data,
                            .w = gd.tensor().data, .bias = nullptr, .preact = gpre.tensor().data,
                            .out = out.tensor().data};
  const std::vector<int> forwards = quack_gemm::gelu_candidates(forward), backwards = quack_gemm::gelu_candidates(backward);
  EXPECT_EQ(!forwards.empty(), qualifies);
  EXPECT_EQ(!backwards.empty(), qualifies);
  for (int candidate : forwards) {
    MXTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
    quack_gemm::run_gelu(candidate, forward, nullptr);
    MXTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_LT(report_error(quack_gemm::name(candidate) + ": pre" + shape, download(*backend, pre), want.pre), 1e-2);
    EXPECT_LT(report_error(quack_gemm::name(candidate) + ": out" + shape, download(*backend, out), want.out), 1e-2);
  }
  for (int candidate : backwards) {
    MXTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
    quack_gemm::run_gelu(candidate, backward, nullptr);
    MXTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_LT(report_error(quack_gemm::name(candidate) + ": dx" + shape, download(*backend, out), want.dx), 1e-2);
  }
  // With the bias partials: one row of sums a tile of rows (each configuration's tile), whose
  // sum in order is the column sums of dx (the oracle's bias gradient).
  const std::vector<float>& want_sums = want.dbias;
  const int64_t max_tiles = (c.rows + private_buffers::kDgeluBiasTileRows - 1) / private_buffers::kDgeluBiasTileRows;
  Buffer partials = backend->allocate("partials", Shape{max_tiles, c.ffn}, DType::f32, Lifetime::scratch);
  quack_gemm::Gelu with_bias = backward;
  with_bias.bias_partials = partials.tensor().ptr<float>();
  const std::vector<int> bias_backwards = quack_gemm::gelu_candidates(with_bias);
  EXPECT_EQ(bias_backwards.size(), qualifies ? backwards.size() : 0u);
  for (int candidate : bias_backwards) {
    const int64_t tiles = quack_gemm::gelu_partial_rows(candidate, c.rows);
    ASSERT_LE(tiles, max_tiles);
    MXTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
    quack_gemm::run_gelu(candidate, with_bias, nullptr);
    MXTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_LT(report_error(quack_gemm::name(candidate) + ": dx" + shape, download(*backend, out), want.dx), 1e-2);
    const std::vector<float> rows = download(*backend, partials);
    std::vector<float> sums(static_cast<size_t>(c.ffn), 0.0f);
    for (int64_t t = 0; t < tiles; ++t)
      for (int64_t j = 0; j < c.ffn; ++j) sums[static_cast<size_t>(j)] += rows[static_cast<size_t>(t * c.ffn + j)];
    EXPECT_LT(report_error(quack_gemm::name(candidate) + ": bias gradient" + shape, sums, want_sums), 1e-2);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaQuackGelu,
                         ::testing::Values(GeluCase{1000, 520, 392},     // no dimension a whole tile
                                           GeluCase{4096, 768, 3072},    // gpt2-124m, 4 sequences
                                           GeluCase{2048, 1600, 6400},   // gpt2-1.5b, 2 sequences
                                           GeluCase{512, 260, 1040}),    // k not a multiple of 8: no quack
                         [](const ::testing::TestParamInfo<GeluCase>& info) {
                           return strf("rows%lld_model%lld_ffn%lld", static_cast<long long>(info.param.rows),
                                       static_cast<long long>(info.param.model), static_cast<long long>(info.param.ffn));
                         });

// The LM head's loss as quack's linear cross-entropy (train.head_loss = quack-lce): Backend::head_loss
// on a backend that fuses it, against the CPU oracle (FP32 logits, the chunked ops) and against
// the chunked path on the GPU (BF16 logits). Shapes: padding columns in the last tile (GPT-2's
// 50,257 of 50,304 among them), a hidden size each gradient tile divides (192: 768; 256: 256) and
// one neither does (1600, GPT-2 1.5B's), logits spread over ±20 (offsets that differ between
// tiles), a head gradient added to (the chunks after the first, gradient accumulation), and a
// vocabulary of 256-column tiles (1024: not a multiple of 192).
// Tolerances: the loss 1e-4 (FP32 logits and sums; the chunked path's BF16 logits are printed
// beside it), dx and dW 1e-2 (E, the strip and dx in BF16).
struct HeadLossCase {
  int64_t rows, hidden, vocab, valid;
  float weight_range;
  bool accumulate;
};

class CudaQuackHeadLoss : public CudaTest, public ::testing::WithParamInterface<HeadLossCase> {};

TEST_P(CudaQuackHeadLoss, FusedMatchesTheOracleAndTheChunkedPath) {
  if (!quack_gemm::lce_carried()) GTEST_SKIP() << "built without quack's linear cross-entropy (scripts/fa4_kernels.sh)";
  const HeadLossCase c = GetParam();
  const std::vector<float> x = random_as(c.rows * c.hidden, 31, DType::bf16);
  std::vector<float> w = random_as(c.vocab * c.hidden, 32, DType::bf16, -c.weight_range, c.weight_range);
  for (int64_t r = c.valid; r < c.vocab; ++r)  // padding rows as mxtrain keeps them: zero
    for (int64_t k = 0; k < c.hidden; ++k) w[static_cast<size_t>(r * c.hidden + k)] = 0.0f;
  const std::vector<float> dw0 = random_vector(static_cast<size_t>(c.vocab * c.hidden), 33, -1e-3f, 1e-3f);
  std::vector<int32_t> ids(static_cast<size_t>(c.rows));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 131 + 7) % c.valid);
  ids[1] = static_cast<int32_t>(c.valid - 1);  // the last valid column: in the tile with the padding
  const float grad_scale = 1.0f / static_cast<float>(c.rows);
  const Shape xs{c.rows, c.hidden}, ws{c.vocab, c.hidden}, ls{c.rows, c.vocab};

  struct Result {
    std::vector<float> losses, dx, dw;
  };
  auto run = [&](Backend& b, DType dtype, bool expect_fused) {
    Buffer gx = upload(b, x, xs, dtype), gw = upload(b, w, ws, dtype), gt = upload_i32(b, ids, Shape{c.rows});
    Buffer logits = b.allocate("logits", ls, dtype, Lifetime::scratch);
    Buffer losses = b.allocate("losses", Shape{c.rows}, DType::f32, Lifetime::scratch);
    Buffer dx = b.allocate("dx", xs, dtype, Lifetime::scratch);
    Buffer dw = upload(b, c.accumulate ? dw0 : std::vector<float>(dw0.size(), 0.0f), ws, DType::f32);
    const HeadLossChunk chunk{.x = gx, .weight = gw, .targets = gt, .losses = losses, .logits = logits,
                              .valid_vocab = c.valid, .grad_scale = grad_scale, .dx = dx, .dweight = dw,
                              .accumulate = c.accumulate};
    EXPECT_EQ(b.fuses_head_loss(chunk), expect_fused) << b.name();
    b.head_loss(chunk);
    return Result{download(b, losses), download(b, dx), download(b, dw)};
  };
  const Result want = run(cpu(), DType::f32, false);
  const Result chunked = run(cuda(), DType::bf16, false);
  BackendOptions options;
  options.head_loss_quack = true;
  std::unique_ptr<Backend> fused_backend = create_backend("cuda", options);
  const Result fused = run(*fused_backend, DType::bf16, true);
  const std::string shape = strf(" %lld rows, hidden %lld, V%lld/%lld, weights ±%g%s", static_cast<long long>(c.rows),
                                 static_cast<long long>(c.hidden), static_cast<long long>(c.valid),
                                 static_cast<long long>(c.vocab), c.weight_range, c.accumulate ? ", dW +=" : "");
  EXPECT_LT(report_error("head loss, quack-lce: loss" + shape, fused.losses, want.losses), 1e-4);
  EXPECT_LT(report_error("head loss, quack-lce: dx" + shape, fused.dx, want.dx), 1e-2);
  EXPECT_LT(report_error("head loss, quack-lce: dW" + shape, fused.dw, want.dw), 1e-2);
  EXPECT_LT(report_error("head loss, chunked: loss" + shape, chunked.losses, want.losses), 1e-2);
  EXPECT_LT(report_error("head loss, chunked: dx" + shape, chunked.dx, want.dx), 1e-2);
  EXPECT_LT(report_error("head loss, chunked: dW" + shape, chunked.dw, want.dw), 1e-2);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaQuackHeadLoss,
                         ::testing::Values(HeadLossCase{256, 768, 768, 700, 0.1f, false},
                                           HeadLossCase{384, 256, 1536, 1536, 1.0f, true},
                                           HeadLossCase{256, 1600, 768, 760, 0.1f, true},
                                           HeadLossCase{128, 768, 50304, 50257, 0.1f, false},
                                           HeadLossCase{256, 512, 1024, 1000, 0.5f, false}),  // 256-column tiles
                         [](const ::testing::TestParamInfo<HeadLossCase>& info) {
                           return strf("rows%lld_hidden%lld_V%lld_of%lld", static_cast<long long>(info.param.rows),
                                       static_cast<long long>(info.param.hidden),
                                       static_cast<long long>(info.param.valid),
                                       static_cast<long long>(info.param.vocab));
                         });

}  // namespace
}  // namespace mxtrain::test
