// The parameter store a planning dryrun trains: the one the real run would build (a local store
// on one GPU; FSDP over a recording fake communicator on several), wrapped so the planner learns
// where in the step each op and allocation happens (micro-batch index, group in use) without any
// hook in model or trainer code.
#pragma once
#include <memory>
#include <string>

#include "mxtrain/backend/backend.hpp"
#include "mxtrain/config/run_config.hpp"
#include "mxtrain/distributed/communicator.hpp"
#include "mxtrain/model/parameters.hpp"
#include "mxtrain/plan/timeline_communicator.hpp"
#include "mxtrain/train/precision.hpp"

namespace mxtrain {

class StepPositionListener {
 public:
  virtual ~StepPositionListener() = default;
  virtual void on_micro_batch(int index, int count) = 0;
  virtual void on_backward_finished() = 0;
  virtual void on_acquire(int group) = 0;
};

// Forwards everything to `inner` and reports the step position to `listener`. Owns the
// communicator the inner store uses (destroyed after it).
class ObservedStore final : public ParameterStore {
 public:
  ObservedStore(std::unique_ptr<Communicator> communicator, std::unique_ptr<ParameterStore> inner,
                StepPositionListener& listener)
      : communicator_(std::move(communicator)), inner_(std::move(inner)), listener_(listener) {}

  const ModelLayout& layout() const override { return inner_->layout(); }
  DType compute_dtype() const override { return inner_->compute_dtype(); }
  DType grad_dtype() const override { return inner_->grad_dtype(); }
  void acquire(int group, Pass pass) override {
    listener_.on_acquire(group);
    inner_->acquire(group, pass);
  }
  void release(int group, Pass pass) override { inner_->release(group, pass); }
  Tensor weight(int group, int index) override { return inner_->weight(group, index); }
  Tensor grad(int group, int index) override { return inner_->grad(group, index); }
  GradTarget grad_target(int group, int index) override { return inner_->grad_target(group, index); }
  void grads_ready(int group) override { inner_->grads_ready(group); }
  void begin_micro_batch(int index, int count) override {
    listener_.on_micro_batch(index, count);
    inner_->begin_micro_batch(index, count);
  }
  void finish_backward() override {
    inner_->finish_backward();
    listener_.on_backward_finished();
  }
  std::vector<ParamShard> shards() override { return inner_->shards(); }
  void grad_norm_sq(const Tensor& out) override { inner_->grad_norm_sq(out); }
  void zero_grads() override { inner_->zero_grads(); }
  void release_grad(int group) override { inner_->release_grad(group); }
  int world_size() const override { return inner_->world_size(); }
  bool shards_are_whole_groups() const override { return inner_->shards_are_whole_groups(); }
  bool step_graph_capturable() const override { return inner_->step_graph_capturable(); }
  std::string strategy_name() const override { return inner_->strategy_name(); }
  std::string describe() const override { return inner_->describe(); }
  bool writes_checkpoint_shards() const override { return inner_->writes_checkpoint_shards(); }

 private:
  std::unique_ptr<Communicator> communicator_;
  std::unique_ptr<ParameterStore> inner_;
  StepPositionListener& listener_;
};

// The store `mxtrain train` builds for this config on rank 0 of `world_size` GPUs, `gpus_per_node`
// of them per node (train/session.cpp make_parameter_store: local on one GPU, FSDP over a fake
// world communicator on several), initialised (no host work on the dryrun) and wrapped in an
// ObservedStore. Collectives and waits go to `communication`.
std::unique_ptr<ParameterStore> make_planning_store(Backend& backend, const RunConfig& config,
                                                    const PrecisionPlan& precision, int world_size, int gpus_per_node,
                                                    StepPositionListener& listener,
                                                    CommunicationListener& communication);

}  // namespace mxtrain
