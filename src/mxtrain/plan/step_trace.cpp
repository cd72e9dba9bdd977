#include "mxtrain/plan/step_trace.hpp"

#include <chrono>
#include <map>
#include <tuple>

#include "mxtrain/core/error.hpp"
#include "mxtrain/model/local_parameters.hpp"
#include "mxtrain/plan/planning_store.hpp"
#include "mxtrain/train/precision.hpp"
#include "mxtrain/train/session.hpp"

namespace mxtrain {
namespace {

using OpKey = std::tuple<OpKind, Phase, DType, int64_t, int64_t, int64_t, double, double, double, DType>;
using CollectiveKey = std::tuple<CollectiveKind, DType, uint64_t, int, std::string>;

// Sees every op, allocation and collective of the dryrun, and (through ObservedStore) where in
// the step they happen.
class Recorder final : public TraceObserver, public CommunicationListener, public StepPositionListener {
 public:
  Recorder(Backend& backend, uint64_t snapshot_at) : backend_(backend), snapshot_at_(snapshot_at) {}

  void on_op(const OpRecord& op) override {
    if (!recording) return;
    ++ops_[slot()][OpKey{op.kind, op.phase, op.dtype, op.m, op.n, op.k, op.flops, op.bytes, op.epilogue_bytes, op.format}];
    TimelineEvent event;
    event.op = op;
    timeline.push_back(event);
  }

  void on_allocation(const AllocationEvent& event) override {
    ++allocation_index_;
    if (event.live_bytes_after > peak.live_bytes) {
      peak.live_bytes = event.live_bytes_after;
      const MemoryStats stats = backend_.memory_stats();
      for (int i = 0; i < kLifetimeCount; ++i) peak.live_by_lifetime[i] = stats.live_by_lifetime[i];
      peak.phase = backend_.phase();
      peak.micro_batch = micro_batch_;
      peak.group = group_;
      peak.step = step;
      peak.allocation_index = allocation_index_;
    }
    if (allocation_index_ == snapshot_at_) snapshot = backend_.allocator().live_entries();
  }

  void on_communicator_created(int) override { ++communicators; }

  void on_issue(int channel, WorkId id, const CollectiveRecord& record) override {
    if (!recording) return;
    ++collectives_[slot()][CollectiveKey{record.kind, record.dtype, record.bytes, record.group_size, record.group}];
    TimelineEvent event;
    event.kind = TimelineEvent::Kind::issue;
    event.collective = record;
    event.channel = channel;
    event.id = id;
    timeline.push_back(event);
  }

  void on_wait(int channel, WorkId id) override {
    if (!recording) return;
    TimelineEvent event;
    event.kind = TimelineEvent::Kind::wait;
    event.channel = channel;
    event.id = id;
    timeline.push_back(event);
  }

  void on_micro_batch(int index, int count) override {
    micro_batch_ = index;
    micro_batch_count_ = count;
    if (!recording) return;
    TimelineEvent event;
    event.kind = TimelineEvent::Kind::micro_batch;
    event.micro_batch = index;
    timeline.push_back(event);
  }
  void on_backward_finished() override { micro_batch_ = -1; }
  void on_acquire(int group) override { group_ = group; }

  void collect(StepTrace& trace) const {
    for (int s = 0; s < kStepSlotCount; ++s) {
      for (const auto& [key, count] : ops_[s]) {
        OpRecord op{std::get<0>(key), std::get<1>(key), std::get<2>(key), std::get<6>(key), std::get<7>(key)};
        op.m = std::get<3>(key);
        op.n = std::get<4>(key);
        op.k = std::get<5>(key);
        op.epilogue_bytes = std::get<8>(key);
        op.format = std::get<9>(key);
        trace.ops[s].push_back(OpCount{op, count});
      }
      for (const auto& [key, count] : collectives_[s]) {
        CollectiveRecord record{std::get<0>(key), std::get<1>(key), std::get<2>(key), std::get<3>(key), std::get<4>(key)};
        trace.collectives[s].push_back(CollectiveCount{record, count});
      }
    }
  }

  bool recording = false;
  int step = 0;
  int communicators = 0;
  PeakSnapshot peak;
  std::vector<TimelineEvent> timeline;
  std::vector<CachingAllocator::LiveEntry> snapshot;

 private:
  int slot() const {
    if (micro_batch_ < 0) return static_cast<int>(StepSlot::outside);
    return static_cast<int>(micro_batch_ == micro_batch_count_ - 1 ? StepSlot::final_micro_batch
                                                                   : StepSlot::non_final_micro_batch);
  }

  Backend& backend_;
  uint64_t snapshot_at_;
  uint64_t allocation_index_ = 0;
  int micro_batch_ = -1, micro_batch_count_ = 1, group_ = -1;
  std::map<OpKey, int64_t> ops_[kStepSlotCount];
  std::map<CollectiveKey, int64_t> collectives_[kStepSlotCount];
};

struct DryrunResult {
  PeakSnapshot peak;
  std::vector<CachingAllocator::LiveEntry> snapshot;
  MemoryStats memory;
};

// One dryrun of `steps` steps; fills the trace's ops when `trace` is given.
DryrunResult run_dryrun(const TraceRequest& request, int64_t micro_batches, uint64_t snapshot_at, StepTrace* trace) {
  const RunConfig& config = request.config;
  CudaAllocationModel cuda_model = request.calibration.cuda_allocations;
  cuda_model.deterministic_attention = config.train.deterministic;
  // The kernels as this binary would take them on the GPU planned for (attention_backward_of).
  cuda_model.flash_attention_4_backward =
      attention_backward_of(config, request.compute_capability) == "flash-attention-4";
  // As CudaBackend::gemm_fuses_swiglu: quack's gated GEMM is sm_90a code.
  cuda_model.gemm_swiglu_fused =
      quack_swiglu_in(gemm_kernels_of(config, request.compute_capability)) && request.compute_capability == 90;
  // As CudaBackend::gemm_fuses_dgelu_bias_gradient: quack's DGELU GEMM with the bias partials.
  cuda_model.gemm_dgelu_bias_fused =
      quack_gelu_in(gemm_kernels_of(config, request.compute_capability)) && request.compute_capability == 90;
  // As CudaBackend::fuses_head_loss: quack's linear cross-entropy is sm_90a code too.
  cuda_model.head_loss_fused =
      head_loss_of(config, request.compute_capability) == "quack-lce" && request.compute_capability == 90;
  DryrunBackend backend(request.capacity_bytes, request.device_label, cuda_model);
  backend.set_native_quantized_gemms(request.native_quantized_gemms);
  // As run_benchmark and the trainer resolve it: the recipe knows what the device runs natively.
  const PrecisionPlan precision = resolve_precision(config, backend);
  Recorder recorder(backend, snapshot_at);
  backend.set_observer(&recorder);

  std::unique_ptr<ParameterStore> store = make_planning_store(backend, config, precision, request.world_size,
                                                             request.gpus_per_node, recorder, recorder);
  TrainingSession session(config, backend, precision, std::move(store));
  const int64_t micro = config.train.micro_batch_size, seq = config.train.seq_len;
  // Token pointers are never read: the dryrun's copy_from_host moves nothing.
  const std::vector<TokenBatch> batches(static_cast<size_t>(micro_batches), TokenBatch{nullptr, nullptr, micro, seq});
  const int64_t global_tokens = micro * seq * micro_batches * request.world_size;
  for (int s = 1; s <= request.steps; ++s) {
    recorder.step = s;
    recorder.recording = trace != nullptr && s == request.steps;
    session.step(batches, global_tokens, config.optimizer.lr, s);
  }
  recorder.recording = false;  // the store's teardown is not part of a step
  backend.set_observer(nullptr);
  DryrunResult result{recorder.peak, recorder.snapshot, backend.memory_stats()};
  if (trace) {
    recorder.collect(*trace);
    trace->timeline = std::move(recorder.timeline);
    trace->communicators = recorder.communicators;
  }
  return result;
}

}  // namespace

StepTrace trace_step(const TraceRequest& request) {
  const auto start = std::chrono::steady_clock::now();
  const RunConfig& config = request.config;
  MXTRAIN_ASSERT(request.steps >= 1 && request.world_size >= 1, "trace_step: steps %d, world %d", request.steps,
                 request.world_size);
  const PrecisionPlan precision = resolve_precision(config.train.precision, "cuda", config.train.tf32);
  const int64_t micro = config.train.micro_batch_size;
  const int64_t global = config.train.global_batch(request.world_size);
  if (global % (micro * request.world_size) != 0)
    throw Error(ErrorKind::config,
                strf("train.global_batch_size = %lld is not a multiple of micro_batch_size x GPUs = %lld x %d",
                     static_cast<long long>(global), static_cast<long long>(micro), request.world_size),
                "choose a global batch that every GPU can split into whole micro-batches");

  StepTrace trace;
  trace.micro_batches = global / (micro * request.world_size);
  trace.traced_micro_batches = std::min<int64_t>(trace.micro_batches, 2);
  trace.precision = precision.name;
  trace.activation_dtype = precision.activation;
  trace.mfu_dtype = mfu_dtype(precision);
  trace.tf32 = config.train.tf32;
  trace.flash_attention_4_backward = attention_backward_of(config, request.compute_capability) == "flash-attention-4";
  DryrunResult first = run_dryrun(request, trace.traced_micro_batches, 0, &trace);
  trace.memory = first.memory;
  trace.peak = first.peak;
  if (request.detailed_peak) {
    // The same dryrun again, stopping at the peak allocation to list what is live there.
    DryrunResult second = run_dryrun(request, trace.traced_micro_batches, first.peak.allocation_index, nullptr);
    MXTRAIN_ASSERT(second.peak.live_bytes == first.peak.live_bytes, "dryrun is not deterministic: peak %zu vs %zu",
                   second.peak.live_bytes, first.peak.live_bytes);
    trace.peak.entries = std::move(second.snapshot);
  }
  trace.dryrun_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return trace;
}

}  // namespace mxtrain
