// Backend::gemm on the cpu backend, beyond the GEMM itself (cpu_linear_test): the epilogues the
// cpu runs apart are exactly the ops one after the other (same bits), each call is one traced
// linear op of its role with the byte formula the planner's measurements were fitted on, and
// argument combinations no backend runs are refused before anything is recorded.
#include "backend/cpu_op_checks.hpp"

namespace mxtrain::test {
namespace {

class Records final : public TraceObserver {
 public:
  void on_op(const OpRecord& record) override { ops.push_back(record); }
  std::vector<OpRecord> ops;
};

double bytes(const Tensor& tensor) { return static_cast<double>(tensor.bytes()); }

class CpuGemm : public testing::Test {
 protected:
  static constexpr int64_t kRows = 6, kIn = 10, kOut = 7;
  CpuBackend backend_{2};
  Buffer x_ = upload(backend_, random_vector(kRows * kIn, 61), Shape{kRows, kIn});
  Buffer weight_ = upload(backend_, random_vector(kOut * kIn, 62, -0.5f, 0.5f), Shape{kOut, kIn});
  Buffer bias_ = upload(backend_, random_vector(kOut, 63), Shape{kOut});
  Buffer dout_ = upload(backend_, random_vector(kRows * kOut, 64), Shape{kRows, kOut});
};

TEST_F(CpuGemm, ResidualEpilogueIsTheGemmThenTheAdd) {
  Buffer residual = upload(backend_, random_vector(kRows * kOut, 65), Shape{kRows, kOut});
  Buffer fused = zeros(backend_, Shape{kRows, kOut}), apart = zeros(backend_, Shape{kRows, kOut});
  Records records;
  backend_.set_observer(&records);
  backend_.gemm({.role = GemmRole::forward, .a = x_, .b = weight_, .out = fused, .bias = bias_, .residual = residual});
  backend_.set_observer(nullptr);
  backend_.gemm({.role = GemmRole::forward, .a = x_, .b = weight_, .out = apart, .bias = bias_});
  backend_.add(apart, residual, apart);
  EXPECT_EQ(download(backend_, fused), download(backend_, apart));
  ASSERT_EQ(records.ops.size(), 1u);
  const OpRecord& op = records.ops[0];
  EXPECT_EQ(op.kind, OpKind::linear_forward);
  EXPECT_EQ(op.flops, 2.0 * kRows * kOut * kIn + kRows * kOut);
  EXPECT_EQ(op.bytes, bytes(x_) + bytes(weight_) + bytes(fused) + bytes(bias_) + bytes(residual));
  EXPECT_EQ(op.epilogue_bytes, bytes(residual));
}

TEST_F(CpuGemm, GeluEpiloguesAreTheGemmAndTheGeluOp) {
  Buffer pre = zeros(backend_, Shape{kRows, kOut}), out = zeros(backend_, Shape{kRows, kOut});
  Buffer dx = zeros(backend_, Shape{kRows, kIn});
  Buffer input_pre = upload(backend_, random_vector(kRows * kIn, 66, -3.0f, 3.0f), Shape{kRows, kIn});
  Records records;
  backend_.set_observer(&records);
  backend_.gemm({.role = GemmRole::forward, .a = x_, .b = weight_, .out = out, .epilogue = GemmEpilogue::gelu_aux_bias,
                 .bias = bias_, .aux = pre});
  backend_.gemm({.role = GemmRole::backward_input, .a = dout_, .b = weight_, .out = dx, .epilogue = GemmEpilogue::dgelu,
                 .aux = input_pre});
  backend_.set_observer(nullptr);

  Buffer pre_apart = zeros(backend_, Shape{kRows, kOut}), out_apart = zeros(backend_, Shape{kRows, kOut});
  backend_.gemm({.role = GemmRole::forward, .a = x_, .b = weight_, .out = pre_apart, .bias = bias_});
  backend_.gelu_forward(pre_apart, out_apart);
  EXPECT_EQ(download(backend_, pre), download(backend_, pre_apart));
  EXPECT_EQ(download(backend_, out), download(backend_, out_apart));
  Buffer product = zeros(backend_, Shape{kRows, kIn}), dx_apart = zeros(backend_, Shape{kRows, kIn});
  backend_.gemm({.role = GemmRole::backward_input, .a = dout_, .b = weight_, .out = product});
  backend_.gelu_backward(product, input_pre, dx_apart);
  EXPECT_EQ(download(backend_, dx), download(backend_, dx_apart));

  ASSERT_EQ(records.ops.size(), 2u);
  EXPECT_EQ(records.ops[0].kind, OpKind::linear_forward);
  EXPECT_EQ(records.ops[0].bytes, bytes(x_) + bytes(weight_) + bytes(pre) + bytes(bias_) + bytes(out));
  EXPECT_EQ(records.ops[0].epilogue_bytes, bytes(out));
  EXPECT_EQ(records.ops[0].m, kRows);
  EXPECT_EQ(records.ops[0].n, kOut);
  EXPECT_EQ(records.ops[1].kind, OpKind::linear_backward_input);
  EXPECT_EQ(records.ops[1].flops, 2.0 * kRows * kIn * kOut);
  EXPECT_EQ(records.ops[1].bytes, bytes(dout_) + bytes(weight_) + bytes(dx) + bytes(input_pre));
  EXPECT_EQ(records.ops[1].epilogue_bytes, bytes(input_pre));
}

// swiglu_aux: aux = x · Wᵀ (2F interleaved gate/up columns), out = swiglu_forward(aux); one op
// whose epilogue traffic is out's write. A backend without the fused kernel runs the two apart,
// and says so (gemm_fuses_swiglu) so that the model asks for it only where it is one kernel.
TEST_F(CpuGemm, SwigluEpilogueIsTheGemmAndTheSwigluOp) {
  constexpr int64_t kFfn = 4;
  Buffer w1 = upload(backend_, random_vector(2 * kFfn * kIn, 67, -0.5f, 0.5f), Shape{2 * kFfn, kIn});
  Buffer pre = zeros(backend_, Shape{kRows, 2 * kFfn}), out = zeros(backend_, Shape{kRows, kFfn});
  EXPECT_FALSE(backend_.gemm_fuses_swiglu(DType::f32, kIn, kFfn));
  Records records;
  backend_.set_observer(&records);
  backend_.gemm({.role = GemmRole::forward, .a = x_, .b = w1, .out = out, .epilogue = GemmEpilogue::swiglu_aux,
                 .aux = pre});
  backend_.set_observer(nullptr);
  Buffer pre_apart = zeros(backend_, Shape{kRows, 2 * kFfn}), out_apart = zeros(backend_, Shape{kRows, kFfn});
  backend_.gemm({.role = GemmRole::forward, .a = x_, .b = w1, .out = pre_apart});
  backend_.swiglu_forward(pre_apart, out_apart);
  EXPECT_EQ(download(backend_, pre), download(backend_, pre_apart));
  EXPECT_EQ(download(backend_, out), download(backend_, out_apart));
  ASSERT_EQ(records.ops.size(), 1u);
  EXPECT_EQ(records.ops[0].kind, OpKind::linear_forward);
  EXPECT_EQ(records.ops[0].flops, 2.0 * kRows * 2 * kFfn * kIn);
  EXPECT_EQ(records.ops[0].bytes, bytes(x_) + bytes(w1) + bytes(pre) + bytes(out));
  EXPECT_EQ(records.ops[0].epilogue_bytes, bytes(out));
  EXPECT_EQ(records.ops[0].n, 2 * kFfn);
  // No bias, no backward role, out half of aux's columns.
  Buffer bias = zeros(backend_, Shape{2 * kFfn});
  EXPECT_ANY_THROW(backend_.gemm({.role = GemmRole::forward, .a = x_, .b = w1, .out = out,
                                  .epilogue = GemmEpilogue::swiglu_aux, .bias = bias, .aux = pre}));
  EXPECT_ANY_THROW(backend_.gemm({.role = GemmRole::forward, .a = x_, .b = w1, .out = pre,
                                  .epilogue = GemmEpilogue::swiglu_aux, .aux = pre}));
  Buffer dx = zeros(backend_, Shape{kRows, kIn});
  EXPECT_ANY_THROW(backend_.gemm({.role = GemmRole::backward_input, .a = pre, .b = w1, .out = dx,
                                  .epilogue = GemmEpilogue::swiglu_aux, .aux = out}));
}

TEST_F(CpuGemm, WeightGradientRecordsItsBiasGradientTwiceWhenAccumulating) {
  Buffer dweight = zeros(backend_, Shape{kOut, kIn}), dbias = zeros(backend_, Shape{kOut});
  Records records;
  backend_.set_observer(&records);
  backend_.gemm({.role = GemmRole::backward_weight, .a = dout_, .b = x_, .out = dweight, .accumulate = true,
                 .bias_gradient = dbias});
  backend_.set_observer(nullptr);
  ASSERT_EQ(records.ops.size(), 1u);
  EXPECT_EQ(records.ops[0].kind, OpKind::linear_backward_weight);
  EXPECT_EQ(records.ops[0].flops, 2.0 * kOut * kIn * kRows + kRows * kOut);
  EXPECT_EQ(records.ops[0].bytes, bytes(dout_) + bytes(x_) + 2 * (bytes(dweight) + bytes(dbias)));
  EXPECT_EQ(records.ops[0].k, kRows);
}

// A DGELU GEMM with a bias gradient on a backend that does not sum it inside the GEMM
// (gemm_fuses_dgelu_bias_gradient: no on the cpu) is the DGELU GEMM, then a column sum of its
// output into the bias gradient: two traced ops, the same bits, overwriting or adding as
// bias_gradient_accumulate says (dx itself is overwritten either way).
TEST_F(CpuGemm, DgeluBiasGradientIsTheGemmThenTheColumnSum) {
  EXPECT_FALSE(backend_.gemm_fuses_dgelu_bias_gradient(DType::f32, kOut, kIn));
  Buffer pre = upload(backend_, random_vector(kRows * kIn, 67, -3.0f, 3.0f), Shape{kRows, kIn});
  Buffer dx = zeros(backend_, Shape{kRows, kIn}), dbias = upload(backend_, random_vector(kIn, 68), Shape{kIn});
  const std::vector<float> dbias_before = download(backend_, dbias);
  Records records;
  backend_.set_observer(&records);
  backend_.gemm({.role = GemmRole::backward_input, .a = dout_, .b = weight_, .out = dx, .epilogue = GemmEpilogue::dgelu,
                 .bias_gradient = dbias, .bias_gradient_accumulate = true, .aux = pre});
  backend_.set_observer(nullptr);
  Buffer dx_apart = zeros(backend_, Shape{kRows, kIn}), sums = zeros(backend_, Shape{kIn});
  backend_.gemm({.role = GemmRole::backward_input, .a = dout_, .b = weight_, .out = dx_apart,
                 .epilogue = GemmEpilogue::dgelu, .aux = pre});
  backend_.column_sum(dx_apart, sums, false);
  EXPECT_EQ(download(backend_, dx), download(backend_, dx_apart));
  const std::vector<float> column_sums = download(backend_, sums), added = download(backend_, dbias);
  for (int64_t c = 0; c < kIn; ++c) EXPECT_FLOAT_EQ(added[c], dbias_before[c] + column_sums[c]) << c;
  ASSERT_EQ(records.ops.size(), 2u);
  EXPECT_EQ(records.ops[0].kind, OpKind::linear_backward_input);
  EXPECT_EQ(records.ops[0].bytes, bytes(dout_) + bytes(weight_) + bytes(dx) + bytes(pre));
  EXPECT_EQ(records.ops[1].kind, OpKind::column_sum);
  EXPECT_EQ(records.ops[1].bytes, bytes(dx) + 2 * bytes(dbias));

  // Overwriting: the column sums alone.
  backend_.gemm({.role = GemmRole::backward_input, .a = dout_, .b = weight_, .out = dx, .epilogue = GemmEpilogue::dgelu,
                 .bias_gradient = dbias, .aux = pre});
  EXPECT_EQ(download(backend_, dbias), column_sums);
}

TEST_F(CpuGemm, RefusesWhatNoBackendRuns) {
  Buffer out = zeros(backend_, Shape{kRows, kOut});
  Buffer pre = zeros(backend_, Shape{kRows, kOut});
  Buffer dbias = zeros(backend_, Shape{kIn});
  Records records;
  backend_.set_observer(&records);
  // A bias on a gradient GEMM, an accumulating GELU epilogue, DGELU on the forward, an aux
  // without its epilogue.
  EXPECT_ANY_THROW(backend_.gemm({.role = GemmRole::backward_input, .a = dout_, .b = weight_, .out = x_,
                                  .bias = bias_}));
  EXPECT_ANY_THROW(backend_.gemm({.role = GemmRole::forward, .a = x_, .b = weight_, .out = out, .accumulate = true,
                                  .epilogue = GemmEpilogue::gelu_aux_bias, .aux = pre}));
  EXPECT_ANY_THROW(backend_.gemm({.role = GemmRole::forward, .a = x_, .b = weight_, .out = out,
                                  .epilogue = GemmEpilogue::dgelu, .aux = pre}));
  EXPECT_ANY_THROW(backend_.gemm({.role = GemmRole::forward, .a = x_, .b = weight_, .out = out, .aux = pre}));
  // A bias gradient on an input-gradient GEMM without DGELU; bias_gradient_accumulate without
  // DGELU's bias gradient.
  EXPECT_ANY_THROW(backend_.gemm({.role = GemmRole::backward_input, .a = dout_, .b = weight_, .out = x_,
                                  .bias_gradient = dbias}));
  EXPECT_ANY_THROW(backend_.gemm({.role = GemmRole::backward_weight, .a = dout_, .b = x_, .out = out,
                                  .bias_gradient_accumulate = true}));
  // A quantized operand with a high-precision one.
  QuantizedTensor q;
  q.data = x_.tensor();
  EXPECT_ANY_THROW(backend_.gemm({.role = GemmRole::forward, .a = q, .b = weight_, .out = out}));
  backend_.set_observer(nullptr);
  EXPECT_TRUE(records.ops.empty());
}

}  // namespace
}  // namespace mxtrain::test
