#include "mxtrain/distributed/nccl/nccl_communicator.hpp"

#include <algorithm>
#include <exception>

#include "mxtrain/backend/cuda/cuda_backend.hpp"
#include "mxtrain/backend/cuda/cuda_check.hpp"
#include "mxtrain/core/error.hpp"

namespace mxtrain {
namespace {

[[noreturn]] void throw_nccl_error(ncclResult_t status, ncclComm_t comm, const char* call, const char* file,
                                   int line) {
  const char* detail = comm ? ncclGetLastError(comm) : ncclGetLastError(nullptr);
  throw Error(ErrorKind::system,
              strf("NCCL call %s failed at %s:%d: %s%s%s", call, file, line, ncclGetErrorString(status),
                   detail && *detail ? ": " : "", detail ? detail : ""),
              "if another rank failed first, its error is in its log (mxtrain launch prints it); otherwise rerun "
              "with NCCL_DEBUG=WARN to see why NCCL failed");
}

#define MXTRAIN_NCCL_CHECK(comm, call)                                                     \
  do {                                                                                     \
    ncclResult_t mxtrain_status_ = (call);                                                 \
    if (mxtrain_status_ != ncclSuccess)                                                    \
      throw_nccl_error(mxtrain_status_, (comm), #call, __FILE__, __LINE__);                \
  } while (0)

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return ncclFloat32;
    case DType::bf16: return ncclBfloat16;
    case DType::f16: return ncclFloat16;
    case DType::i32: return ncclInt32;
    case DType::u8:
    case DType::e4m3:
    case DType::e5m2:
    case DType::e8m0:
    case DType::e2m1: return ncclUint8;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(DType dtype, ReduceOp op) {
  const bool byte_format = dtype != DType::f32 && dtype != DType::bf16 && dtype != DType::f16 && dtype != DType::i32;
  if (byte_format)
    throw Error(ErrorKind::unsupported, "NCCL reductions of " + std::string(dtype_name(dtype)) + " tensors",
                "reduce in f32 or bf16 (dist.reduce_dtype)");
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::average: return ncclAvg;
    case ReduceOp::max: return ncclMax;
  }
  return ncclSum;
}

size_t element_count(const Tensor& tensor) {
  MXTRAIN_ASSERT(tensor.device == Device::cuda, "the NCCL communicator needs device tensors, got %s",
                 tensor.describe().c_str());
  MXTRAIN_ASSERT(tensor.is_contiguous(), "NCCL collectives need contiguous tensors, got %s", tensor.describe().c_str());
  return tensor.dtype == DType::e2m1 ? tensor.bytes() : static_cast<size_t>(tensor.numel());
}

}  // namespace

NcclCommunicator::NcclCommunicator(Backend& backend, cudaStream_t compute_stream, ncclComm_t comm,
                                   std::string group_name)
    : backend_(backend), compute_stream_(compute_stream), comm_(comm), group_(std::move(group_name)) {
  MXTRAIN_NCCL_CHECK(comm_, ncclCommUserRank(comm_, &rank_));
  MXTRAIN_NCCL_CHECK(comm_, ncclCommCount(comm_, &size_));
  // Higher priority than compute, so a collective's kernels start as soon as their inputs exist.
  int least = 0, greatest = 0;
  MXTRAIN_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  MXTRAIN_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest));
  MXTRAIN_CUDA_CHECK(cudaEventCreateWithFlags(&compute_ready_, cudaEventDisableTiming));
  MXTRAIN_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&host_scalar_), sizeof(double)));
  scalar_ = backend_.allocate("nccl." + group_ + ".scalar", Shape{2}, DType::f32, Lifetime::communication);
}

NcclCommunicator::~NcclCommunicator() {
  if (std::uncaught_exceptions() > 0) {
    // Peers may be gone: abort instead of waiting for collectives that never finish.
    ncclCommAbort(comm_);
  } else {
    cudaStreamSynchronize(stream_);
    ncclCommDestroy(comm_);
  }
  for (auto& entry : in_flight_) cudaEventDestroy(entry.second);
  for (cudaEvent_t event : spare_events_) cudaEventDestroy(event);
  cudaEventDestroy(compute_ready_);
  cudaFreeHost(host_scalar_);
  cudaStreamDestroy(stream_);
}

void NcclCommunicator::follow_compute() {
  MXTRAIN_CUDA_CHECK(cudaEventRecord(compute_ready_, compute_stream_));
  MXTRAIN_CUDA_CHECK(cudaStreamWaitEvent(stream_, compute_ready_, 0));
}

WorkId NcclCommunicator::complete() {
  cudaEvent_t event = nullptr;
  if (spare_events_.empty()) {
    MXTRAIN_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  } else {
    event = spare_events_.back();
    spare_events_.pop_back();
  }
  MXTRAIN_CUDA_CHECK(cudaEventRecord(event, stream_));
  const WorkId id = next_id_++;
  in_flight_[id] = event;
  return id;
}

WorkId NcclCommunicator::all_gather(const Tensor& shard, const Tensor& gathered) {
  MXTRAIN_ASSERT(gathered.dtype == shard.dtype && gathered.numel() == shard.numel() * size_,
                 "all_gather: %s -> %s over %d ranks", shard.describe().c_str(), gathered.describe().c_str(), size_);
  record(CollectiveKind::all_gather, gathered, gathered.bytes());
  follow_compute();
  MXTRAIN_NCCL_CHECK(comm_, ncclAllGather(shard.data, gathered.data, element_count(shard), nccl_type(shard.dtype),
                                          comm_, stream_));
  return complete();
}

WorkId NcclCommunicator::reduce_scatter(const Tensor& full, const Tensor& shard, ReduceOp op) {
  MXTRAIN_ASSERT(full.dtype == shard.dtype && full.numel() == shard.numel() * size_,
                 "reduce_scatter: %s -> %s over %d ranks", full.describe().c_str(), shard.describe().c_str(), size_);
  record(CollectiveKind::reduce_scatter, full, full.bytes());
  follow_compute();
  MXTRAIN_NCCL_CHECK(comm_, ncclReduceScatter(full.data, shard.data, element_count(shard), nccl_type(full.dtype),
                                              nccl_op(full.dtype, op), comm_, stream_));
  return complete();
}

WorkId NcclCommunicator::all_reduce(const Tensor& data, ReduceOp op) {
  record(CollectiveKind::all_reduce, data, data.bytes());
  follow_compute();
  MXTRAIN_NCCL_CHECK(comm_, ncclAllReduce(data.data, data.data, element_count(data), nccl_type(data.dtype),
                                          nccl_op(data.dtype, op), comm_, stream_));
  return complete();
}

WorkId NcclCommunicator::broadcast(const Tensor& data, int root) {
  MXTRAIN_ASSERT(root >= 0 && root < size_, "broadcast root %d of %d", root, size_);
  record(CollectiveKind::broadcast, data, data.bytes());
  follow_compute();
  MXTRAIN_NCCL_CHECK(comm_, ncclBroadcast(data.data, data.data, element_count(data), nccl_type(data.dtype), root,
                                          comm_, stream_));
  return complete();
}

void NcclCommunicator::wait(WorkId id) {
  // One stream per communicator: the event of `id` also covers everything issued before it.
  auto found = in_flight_.find(id);
  if (found != in_flight_.end()) MXTRAIN_CUDA_CHECK(cudaStreamWaitEvent(compute_stream_, found->second, 0));
  for (auto it = in_flight_.begin(); it != in_flight_.end() && it->first <= id;) {
    spare_events_.push_back(it->second);
    it = in_flight_.erase(it);
  }
}

void NcclCommunicator::barrier() {
  record(CollectiveKind::barrier, Tensor(), 0);
  all_reduce_scalar(0.0, ReduceOp::sum);
}

double NcclCommunicator::all_reduce_scalar(double value, ReduceOp op) {
  *host_scalar_ = value;
  void* device = scalar_.tensor().data;
  MXTRAIN_CUDA_CHECK(cudaMemcpyAsync(device, host_scalar_, sizeof(double), cudaMemcpyHostToDevice, stream_));
  const ncclRedOp_t reduce = op == ReduceOp::max ? ncclMax : (op == ReduceOp::average ? ncclAvg : ncclSum);
  MXTRAIN_NCCL_CHECK(comm_, ncclAllReduce(device, device, 1, ncclFloat64, reduce, comm_, stream_));
  MXTRAIN_CUDA_CHECK(cudaMemcpyAsync(host_scalar_, device, sizeof(double), cudaMemcpyDeviceToHost, stream_));
  MXTRAIN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return *host_scalar_;
}

std::unique_ptr<Communicator> NcclCommunicator::split(int color, int key, std::string group_name) {
  ncclComm_t child = nullptr;
  MXTRAIN_NCCL_CHECK(comm_, ncclCommSplit(comm_, color, key, &child, nullptr));
  MXTRAIN_ASSERT(child != nullptr, "ncclCommSplit gave no communicator for color %d", color);
  auto result = std::make_unique<NcclCommunicator>(backend_, compute_stream_, child, std::move(group_name));
  result->set_observer(observer_);
  return result;
}

// ---- entry points for dist/communicator_factory.cpp ----------------------------------------------

std::string nccl_unique_id_bytes() {
  ncclUniqueId id;
  MXTRAIN_NCCL_CHECK(nullptr, ncclGetUniqueId(&id));
  return std::string(id.internal, sizeof id.internal);
}

std::unique_ptr<Communicator> create_nccl_communicator(Backend& backend, const std::string& unique_id, int rank,
                                                       int world_size) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  MXTRAIN_ASSERT(cuda != nullptr, "the NCCL communicator needs the cuda backend, got %s",
                 std::string(backend.name()).c_str());
  MXTRAIN_ASSERT(unique_id.size() == sizeof(ncclUniqueId::internal), "NCCL unique id of %zu bytes", unique_id.size());
  ncclUniqueId id;
  std::copy(unique_id.begin(), unique_id.end(), id.internal);
  MXTRAIN_CUDA_CHECK(cudaSetDevice(cuda->device_index()));
  ncclComm_t comm = nullptr;
  MXTRAIN_NCCL_CHECK(nullptr, ncclCommInitRank(&comm, world_size, id, rank));
  return std::make_unique<NcclCommunicator>(backend, cuda->stream(), comm, "world");
}

int cuda_visible_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

}  // namespace mxtrain
