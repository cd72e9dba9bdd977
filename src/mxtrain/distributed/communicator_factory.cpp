#include "mxtrain/distributed/communicator_factory.hpp"

#include <cstdlib>

#include "mxtrain/core/error.hpp"
#include "mxtrain/distributed/single_communicator.hpp"
#include "mxtrain/runtime/tcp_rendezvous.hpp"
#ifdef MXTRAIN_HAVE_MPI
#include "mxtrain/distributed/mpi/mpi_communicator.hpp"
#endif

namespace mxtrain {

#ifdef MXTRAIN_HAVE_CUDA
// dist/nccl/nccl_communicator.cpp, compiled into mxtrain_cuda.
std::string nccl_unique_id_bytes();
std::unique_ptr<Communicator> create_nccl_communicator(Backend& backend, const std::string& unique_id, int rank,
                                                       int world_size);
int cuda_visible_device_count();
#endif

namespace {

std::unique_ptr<Communicator> create_mpi_world(const runtime::RankEnvironment& environment) {
#ifdef MXTRAIN_HAVE_MPI
  if (environment.world_size > 1 && !environment.started_by_mpi())
    throw Error(ErrorKind::config,
                strf("%d CPU ranks need MPI collectives, but these ranks were started by %s, not mpirun",
                     environment.world_size, runtime::environment_source_name(environment.source)),
                strf("run `mpirun -np %d mxtrain train ...` (as root add --allow-run-as-root); `mxtrain launch` "
                     "starts one rank per GPU (docs/distributed.md)",
                     environment.world_size));
  const int mpi_size = mpi_world_size();
  if (mpi_size != environment.world_size)
    throw Error(ErrorKind::config,
                strf("MPI_COMM_WORLD has %d ranks but the rank environment (%s) says %d", mpi_size,
                     runtime::environment_source_name(environment.source), environment.world_size),
                "start the ranks with one mpirun and no other launcher variables (unset RANK/WORLD_SIZE)");
  return MpiCommunicator::world();
#else
  (void)environment;
  throw Error(ErrorKind::unsupported, "this mxtrain was built without MPI, so CPU ranks cannot communicate",
              "install Open MPI (Debian: apt-get install libopenmpi-dev openmpi-bin) and rebuild, or train on one "
              "process");
#endif
}

std::unique_ptr<Communicator> create_nccl_world(const runtime::RankEnvironment& environment, Backend& backend) {
#ifdef MXTRAIN_HAVE_CUDA
  // NVLink SHARP (multicast) stays off unless the user asked for it (see docs/distributed.md).
  ::setenv("NCCL_NVLS_ENABLE", "0", 0);
  // The FSDP store runs collectives of several communicators at once (gather and reduce); every
  // rank issues them in the same host order, and this makes the GPUs launch them in that order
  // too (NCCL >= 2.26), so two ranks can never wait on each other's other communicator.
  ::setenv("NCCL_LAUNCH_ORDER_IMPLICIT", "1", 0);
  if (!environment.network_interface.empty()) ::setenv("NCCL_SOCKET_IFNAME", environment.network_interface.c_str(), 0);
  const bool rank0 = environment.rank == 0;
  std::string unique_id;
  if (environment.world_size == 1 || std::getenv("NCCL_COMM_ID") != nullptr) {
    unique_id = nccl_unique_id_bytes();  // with NCCL_COMM_ID every rank derives the same id
  } else if (environment.started_by_mpi()) {
#ifdef MXTRAIN_HAVE_MPI
    unique_id = mpi_broadcast_bytes(rank0 ? nccl_unique_id_bytes() : std::string());
#else
    unique_id = runtime::tcp_broadcast_from_rank0(environment, rank0 ? nccl_unique_id_bytes() : std::string());
#endif
  } else {
    unique_id = runtime::tcp_broadcast_from_rank0(environment, rank0 ? nccl_unique_id_bytes() : std::string());
  }
  return create_nccl_communicator(backend, unique_id, environment.rank, environment.world_size);
#else
  (void)environment;
  (void)backend;
  throw Error(ErrorKind::unsupported, "this mxtrain was built without CUDA, so it has no NCCL communicator",
              "build with the cuda preset, or use dist.backend = mpi with --device cpu under mpirun");
#endif
}

}  // namespace

std::string resolve_communicator_kind(const std::string& requested, const std::string& device, int world_size) {
  if (requested == "auto") {
    if (world_size == 1) return "single";
    return device == "cuda" ? "nccl" : "mpi";
  }
  if (requested == "nccl" && device != "cuda")
    throw Error(ErrorKind::config, "dist.backend = nccl needs train.device = cuda",
                "use dist.backend = auto (MPI on CPUs) or train on GPUs");
  if (requested == "mpi" && device != "cpu")
    throw Error(ErrorKind::config, "dist.backend = mpi works on host memory, so it needs train.device = cpu",
                "use dist.backend = auto (NCCL on GPUs) or train on CPUs");
  if (requested != "nccl" && requested != "mpi")
    throw Error(ErrorKind::config, "dist.backend = " + requested + " is unknown", "use auto, nccl or mpi");
  return requested;
}

std::unique_ptr<Communicator> create_world_communicator(const std::string& kind,
                                                        const runtime::RankEnvironment& environment,
                                                        Backend& backend) {
  if (kind == "single") {
    MXTRAIN_ASSERT(environment.world_size == 1, "single-process communicator for %d ranks", environment.world_size);
    return std::make_unique<SingleProcessCommunicator>(backend);
  }
  if (kind == "mpi") return create_mpi_world(environment);
  if (kind == "nccl") return create_nccl_world(environment, backend);
  throw Error(ErrorKind::config, "unknown communicator " + kind, "use dist.backend = auto, nccl or mpi");
}

void finish_communication() {
#ifdef MXTRAIN_HAVE_MPI
  finalize_mpi();
#endif
}

int visible_gpu_count() {
#ifdef MXTRAIN_HAVE_CUDA
  return cuda_visible_device_count();
#else
  return 0;
#endif
}

}  // namespace mxtrain
