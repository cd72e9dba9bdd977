// The planner prices the step the real run takes: the dryrun of a config (trace_step, which
// trains an ObservedStore around the store the run would build) and a real CPU run of the same
// config issue the same ops and collectives, in the same order, for the local store and every
// FSDP strategy, with gradient clipping on and off. Where the session's decisions depend on
// what kind of store it trains (the norm pass, the step graph), a wrapper must not change them.
//
// The CPU run of an FSDP config is one rank of the planned world: the real store, session and
// CPU ops over a FakeCommunicator, whose peers move no data. Data does not steer the op sequence
// (fp32, no loss scaling), so the sequence is the one every rank of a real world runs.
#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <vector>

#include "mxtrain/backend/backend.hpp"
#include "mxtrain/core/error.hpp"
#include "mxtrain/distributed/fake_communicator.hpp"
#include "mxtrain/distributed/fsdp_store.hpp"
#include "mxtrain/plan/step_trace.hpp"
#include "mxtrain/train/precision.hpp"
#include "mxtrain/train/session.hpp"
#include "plan/plan_test_support.hpp"

namespace mxtrain {
namespace {

constexpr int kSteps = 2;
constexpr int kGpusPerNode = 2;  // hybrid_shard's shard groups: 2 ranks x 2 replicas of 4

std::string op_event(const OpRecord& op) {
  return strf("op %s %s %s m%lld n%lld k%lld", op_kind_name(op.kind), phase_name(op.phase),
              std::string(dtype_name(op.dtype)).c_str(), static_cast<long long>(op.m), static_cast<long long>(op.n),
              static_cast<long long>(op.k));
}

std::string collective_event(const CollectiveRecord& record) {
  return strf("%s %s@%s/%d", collective_kind_name(record.kind), std::string(dtype_name(record.dtype)).c_str(),
              record.group.c_str(), record.group_size);
}

// The ops of the real run's last step and the collectives its store issues, in issue order.
class RunRecorder final : public TraceObserver, public CollectiveObserver {
 public:
  void on_op(const OpRecord& op) override {
    if (recording) events.push_back(op_event(op));
  }
  void on_allocation(const AllocationEvent&) override {}
  void on_collective(const CollectiveRecord& record) override {
    if (recording) events.push_back(collective_event(record));
  }
  bool recording = false;
  std::vector<std::string> events;
};

struct SequenceCase {
  std::string strategy;  // "local": one process
  double grad_clip;
  int world_size;
  std::string name() const { return strategy + (grad_clip > 0 ? "_clip" : "_noclip"); }
};

void PrintTo(const SequenceCase& c, std::ostream* out) { *out << c.name(); }

RunConfig case_config(const SequenceCase& c) {
  // Two micro-batches a rank: the trace runs both (it runs min(A, 2)), and FSDP's non-final one
  // differs from the final one.
  RunConfig config = test::small_run("llama", "selective", 2, 16, 2 * 2 * c.world_size);
  config.optimizer.grad_clip = c.grad_clip;
  if (c.strategy != "local") config.dist.strategy = c.strategy;
  return config;
}

std::vector<std::string> real_cpu_run(const RunConfig& config, int world_size) {
  std::unique_ptr<Backend> backend = create_backend("cpu", backend_options(config));
  const PrecisionPlan precision = resolve_precision(config, *backend);
  RunRecorder recorder;
  backend->set_observer(&recorder);
  std::unique_ptr<FakeCommunicator> world;
  if (world_size > 1) {
    const FsdpOptions options = resolve_fsdp_options(config.dist, world_size, kGpusPerNode);
    world = std::make_unique<FakeCommunicator>(world_size, 0, fsdp_group_sizes(options, world_size));
    world->set_observer(&recorder);  // before the store splits its communicators off it
  }
  TrainingSession session(config, *backend, precision,
                          make_parameter_store(*backend, config, precision, world.get(), kGpusPerNode));
  const int64_t micro = config.train.micro_batch_size, seq = config.train.seq_len;
  const int64_t micro_batches = config.train.global_batch(world_size) / (micro * world_size);
  std::vector<int32_t> tokens(static_cast<size_t>(micro * seq)), targets(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int32_t>((i * 37 + 11) % static_cast<size_t>(config.model.vocab_size));
    targets[i] = static_cast<int32_t>((i * 53 + 5) % static_cast<size_t>(config.model.vocab_size));
  }
  const std::vector<TokenBatch> batches(static_cast<size_t>(micro_batches),
                                        TokenBatch{tokens.data(), targets.data(), micro, seq});
  for (int step = 1; step <= kSteps; ++step) {
    recorder.recording = step == kSteps;
    // Launched only: over a FakeCommunicator the gathered weights are not the peers' (no data
    // moves), so the loss means nothing and last_result's finiteness check must not judge it.
    session.launch_step(batches, micro * seq * micro_batches * world_size, 1e-3, step);
  }
  recorder.recording = false;
  backend->set_observer(nullptr);
  return recorder.events;
}

std::vector<std::string> planned_run(const RunConfig& config, int world_size) {
  TraceRequest request;
  request.config = config;
  request.world_size = world_size;
  request.gpus_per_node = kGpusPerNode;
  request.calibration.cuda_allocations.enabled = false;
  request.device_label = "test";
  request.steps = kSteps;
  request.detailed_peak = false;
  const StepTrace trace = trace_step(request);
  std::vector<std::string> events;
  for (const TimelineEvent& event : trace.timeline) {
    if (event.kind == TimelineEvent::Kind::op) events.push_back(op_event(event.op));
    if (event.kind == TimelineEvent::Kind::issue) events.push_back(collective_event(event.collective));
  }
  return events;
}

int count_of(const std::vector<std::string>& events, const std::string& prefix) {
  int count = 0;
  for (const std::string& event : events) count += event.rfind(prefix, 0) == 0;
  return count;
}

class PlanRunOpSequence : public ::testing::TestWithParam<SequenceCase> {};

TEST_P(PlanRunOpSequence, PlanIssuesTheOpsOfTheRealCpuRun) {
  const SequenceCase& c = GetParam();
  const RunConfig config = case_config(c);
  const std::vector<std::string> real = real_cpu_run(config, c.world_size);
  const std::vector<std::string> planned = planned_run(config, c.world_size);
  ASSERT_GT(real.size(), 50u) << "the real step should have recorded its ops";
  // The norm pass is what a wrapped store used to change: say so before the whole sequence.
  const std::string norm = "op sum_of_squares";
  EXPECT_EQ(count_of(planned, norm), count_of(real, norm)) << "squared-norm passes";
  EXPECT_EQ(count_of(planned, "op adamw"), count_of(real, "op adamw")) << "AdamW passes";
  size_t first_difference = 0;
  while (first_difference < real.size() && first_difference < planned.size() &&
         real[first_difference] == planned[first_difference])
    ++first_difference;
  EXPECT_EQ(planned.size(), real.size()) << "events in the step";
  EXPECT_EQ(first_difference, std::max(real.size(), planned.size()))
      << "first difference at event " << first_difference << ": real '"
      << (first_difference < real.size() ? real[first_difference] : "(end)") << "', planned '"
      << (first_difference < planned.size() ? planned[first_difference] : "(end)") << "'";
}

std::vector<SequenceCase> cases() {
  std::vector<SequenceCase> list;
  for (double clip : {0.0, 1.0}) {
    list.push_back({"local", clip, 1});
    for (const char* strategy : {"full_shard", "shard_grad_op", "no_shard", "hybrid_shard"})
      list.push_back({strategy, clip, 4});
  }
  return list;
}

INSTANTIATE_TEST_SUITE_P(Stores, PlanRunOpSequence, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<SequenceCase>& info) { return info.param.name(); });

}  // namespace
}  // namespace mxtrain
