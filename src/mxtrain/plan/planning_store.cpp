#include "mxtrain/plan/planning_store.hpp"

#include "mxtrain/distributed/fake_communicator.hpp"
#include "mxtrain/distributed/fsdp_store.hpp"
#include "mxtrain/train/session.hpp"

namespace mxtrain {

std::unique_ptr<ParameterStore> make_planning_store(Backend& backend, const RunConfig& config,
                                                    const PrecisionPlan& precision, int world_size, int gpus_per_node,
                                                    StepPositionListener& listener,
                                                    CommunicationListener& communication) {
  std::unique_ptr<Communicator> world;
  if (world_size > 1) {
    const FsdpOptions options = resolve_fsdp_options(config.dist, world_size, gpus_per_node);
    world = std::make_unique<TimelineCommunicator>(
        std::make_unique<FakeCommunicator>(world_size, 0, fsdp_group_sizes(options, world_size)), communication,
        std::make_shared<int>(0));
  }
  std::unique_ptr<ParameterStore> store = make_parameter_store(backend, config, precision, world.get(), gpus_per_node);
  return std::make_unique<ObservedStore>(std::move(world), std::move(store), listener);
}

}  // namespace mxtrain
