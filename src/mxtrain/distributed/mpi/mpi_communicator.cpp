#include "mxtrain/distributed/mpi/mpi_communicator.hpp"

#include <climits>
#include <exception>

#include "mxtrain/core/dtype.hpp"
#include "mxtrain/core/error.hpp"

namespace mxtrain {
namespace {

[[noreturn]] void throw_mpi_error(int status, const char* call, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  MPI_Error_string(status, text, &length);
  throw Error(ErrorKind::system, strf("MPI call %s failed at %s:%d: %s", call, file, line, text),
              "another rank probably failed first: look for its error above (mpirun names it); otherwise check "
              "the MPI installation with `mpirun -np 2 hostname`");
}

#define MXTRAIN_MPI_CHECK(call)                                                   \
  do {                                                                            \
    int mxtrain_status_ = (call);                                                 \
    if (mxtrain_status_ != MPI_SUCCESS) throw_mpi_error(mxtrain_status_, #call, __FILE__, __LINE__); \
  } while (0)

template <uint16_t (*Encode)(float), float (*Decode)(uint16_t), bool Max>
void reduce_16bit(void* in, void* inout, int* length, MPI_Datatype*) {
  const uint16_t* a = static_cast<const uint16_t*>(in);
  uint16_t* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *length; ++i) {
    const float x = Decode(a[i]), y = Decode(b[i]);
    b[i] = Encode(Max ? (x > y ? x : y) : x + y);
  }
}

struct SixteenBitOps {
  MPI_Op bf16_sum = MPI_OP_NULL, bf16_max = MPI_OP_NULL, f16_sum = MPI_OP_NULL, f16_max = MPI_OP_NULL;
  SixteenBitOps() {
    MXTRAIN_MPI_CHECK(MPI_Op_create(&reduce_16bit<float_to_bf16, bf16_to_float, false>, 1, &bf16_sum));
    MXTRAIN_MPI_CHECK(MPI_Op_create(&reduce_16bit<float_to_bf16, bf16_to_float, true>, 1, &bf16_max));
    MXTRAIN_MPI_CHECK(MPI_Op_create(&reduce_16bit<float_to_f16, f16_to_float, false>, 1, &f16_sum));
    MXTRAIN_MPI_CHECK(MPI_Op_create(&reduce_16bit<float_to_f16, f16_to_float, true>, 1, &f16_max));
  }
};

const SixteenBitOps& sixteen_bit_ops() {
  static const SixteenBitOps ops;  // created after MPI_Init, released by MPI_Finalize
  return ops;
}

MPI_Datatype mpi_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return MPI_FLOAT;
    case DType::i32: return MPI_INT;
    case DType::bf16:
    case DType::f16: return MPI_UINT16_T;
    case DType::u8:
    case DType::e4m3:
    case DType::e5m2:
    case DType::e8m0:
    case DType::e2m1: return MPI_UINT8_T;
  }
  return MPI_DATATYPE_NULL;
}

MPI_Op mpi_op(DType dtype, ReduceOp op) {
  const bool max = op == ReduceOp::max;
  switch (dtype) {
    case DType::f32:
    case DType::i32: return max ? MPI_MAX : MPI_SUM;
    case DType::bf16: return max ? sixteen_bit_ops().bf16_max : sixteen_bit_ops().bf16_sum;
    case DType::f16: return max ? sixteen_bit_ops().f16_max : sixteen_bit_ops().f16_sum;
    default: break;
  }
  throw Error(ErrorKind::unsupported, strf("MPI reductions of %s tensors", std::string(dtype_name(dtype)).c_str()),
              "reduce in f32 or bf16 (dist.reduce_dtype)");
}

int element_count(const Tensor& tensor) {
  MXTRAIN_ASSERT(tensor.device == Device::cpu, "the MPI communicator needs host tensors, got %s",
                 tensor.describe().c_str());
  MXTRAIN_ASSERT(tensor.is_contiguous(), "MPI collectives need contiguous tensors, got %s", tensor.describe().c_str());
  const size_t count = tensor.dtype == DType::e2m1 ? tensor.bytes() : static_cast<size_t>(tensor.numel());
  MXTRAIN_ASSERT(count <= static_cast<size_t>(INT_MAX), "MPI collective of %zu elements exceeds int", count);
  return static_cast<int>(count);
}

// data /= divisor, element-wise in the tensor's own format.
void divide_in_place(const Tensor& data, int divisor) {
  const int64_t n = data.numel();
  const float factor = 1.0f / static_cast<float>(divisor);
  switch (data.dtype) {
    case DType::f32: {
      float* values = data.ptr<float>();
      for (int64_t i = 0; i < n; ++i) values[i] *= factor;
      return;
    }
    case DType::bf16: {
      uint16_t* values = data.ptr<uint16_t>();
      for (int64_t i = 0; i < n; ++i) values[i] = float_to_bf16(bf16_to_float(values[i]) * factor);
      return;
    }
    case DType::f16: {
      uint16_t* values = data.ptr<uint16_t>();
      for (int64_t i = 0; i < n; ++i) values[i] = float_to_f16(f16_to_float(values[i]) * factor);
      return;
    }
    default:
      throw Error(ErrorKind::unsupported, "average of " + std::string(dtype_name(data.dtype)) + " tensors",
                  "average f32, bf16 or f16 tensors");
  }
}

}  // namespace

void ensure_mpi_initialized() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return;
  int provided = 0;
  MXTRAIN_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided));
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
}

int mpi_world_size() {
  ensure_mpi_initialized();
  int size = 1;
  MXTRAIN_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));
  return size;
}

int mpi_world_rank() {
  ensure_mpi_initialized();
  int rank = 0;
  MXTRAIN_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  return rank;
}

std::string mpi_broadcast_bytes(const std::string& bytes_on_rank0) {
  ensure_mpi_initialized();
  int length = static_cast<int>(bytes_on_rank0.size());
  MXTRAIN_MPI_CHECK(MPI_Bcast(&length, 1, MPI_INT, 0, MPI_COMM_WORLD));
  std::string bytes = bytes_on_rank0;
  bytes.resize(static_cast<size_t>(length));
  MXTRAIN_MPI_CHECK(MPI_Bcast(bytes.data(), length, MPI_CHAR, 0, MPI_COMM_WORLD));
  return bytes;
}

void finalize_mpi() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Finalize();
}

std::unique_ptr<MpiCommunicator> MpiCommunicator::world() {
  ensure_mpi_initialized();
  MPI_Comm comm = MPI_COMM_NULL;
  MXTRAIN_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm));
  return std::make_unique<MpiCommunicator>(comm, "world");
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::string group_name) : comm_(comm), group_(std::move(group_name)) {
  MXTRAIN_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  MXTRAIN_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  MXTRAIN_MPI_CHECK(MPI_Comm_size(comm_, &size_));
}

MpiCommunicator::~MpiCommunicator() {
  // Unwinding an error (or abandoning collectives): peers may be stuck in a collective, so
  // nothing collective happens here; the rank exits without finalizing and mpirun ends the job.
  if (std::uncaught_exceptions() > 0 || !pending_.empty()) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

WorkId MpiCommunicator::start(MPI_Request request, std::function<void()> finish) {
  const WorkId id = next_id_++;
  pending_[id] = Pending{request, std::move(finish)};
  return id;
}

WorkId MpiCommunicator::all_gather(const Tensor& shard, const Tensor& gathered) {
  MXTRAIN_ASSERT(gathered.dtype == shard.dtype && gathered.numel() == shard.numel() * size_,
                 "all_gather: %s -> %s over %d ranks", shard.describe().c_str(), gathered.describe().c_str(), size_);
  record(CollectiveKind::all_gather, gathered, gathered.bytes());
  const int count = element_count(shard);
  element_count(gathered);
  const MPI_Datatype type = mpi_type(shard.dtype);
  const char* own_slot = static_cast<const char*>(gathered.data) + static_cast<size_t>(rank_) * shard.bytes();
  const void* send = shard.data == own_slot ? MPI_IN_PLACE : shard.data;
  MPI_Request request = MPI_REQUEST_NULL;
  MXTRAIN_MPI_CHECK(MPI_Iallgather(send, count, type, gathered.data, count, type, comm_, &request));
  return start(request);
}

WorkId MpiCommunicator::reduce_scatter(const Tensor& full, const Tensor& shard, ReduceOp op) {
  MXTRAIN_ASSERT(full.dtype == shard.dtype && full.numel() == shard.numel() * size_,
                 "reduce_scatter: %s -> %s over %d ranks", full.describe().c_str(), shard.describe().c_str(), size_);
  MXTRAIN_ASSERT(full.data != shard.data, "reduce_scatter: input and output overlap");
  record(CollectiveKind::reduce_scatter, full, full.bytes());
  const int count = element_count(shard);
  element_count(full);
  MPI_Request request = MPI_REQUEST_NULL;
  MXTRAIN_MPI_CHECK(MPI_Ireduce_scatter_block(full.data, shard.data, count, mpi_type(full.dtype),
                                              mpi_op(full.dtype, op), comm_, &request));
  if (op != ReduceOp::average) return start(request);
  const int size = size_;
  return start(request, [shard, size] { divide_in_place(shard, size); });
}

WorkId MpiCommunicator::all_reduce(const Tensor& data, ReduceOp op) {
  record(CollectiveKind::all_reduce, data, data.bytes());
  const int count = element_count(data);
  MPI_Request request = MPI_REQUEST_NULL;
  MXTRAIN_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, data.data, count, mpi_type(data.dtype), mpi_op(data.dtype, op),
                                   comm_, &request));
  if (op != ReduceOp::average) return start(request);
  const int size = size_;
  return start(request, [data, size] { divide_in_place(data, size); });
}

WorkId MpiCommunicator::broadcast(const Tensor& data, int root) {
  MXTRAIN_ASSERT(root >= 0 && root < size_, "broadcast root %d of %d", root, size_);
  record(CollectiveKind::broadcast, data, data.bytes());
  MPI_Request request = MPI_REQUEST_NULL;
  MXTRAIN_MPI_CHECK(MPI_Ibcast(data.data, element_count(data), mpi_type(data.dtype), root, comm_, &request));
  return start(request);
}

void MpiCommunicator::wait(WorkId id) {
  // Waiting for `id` completes it and everything this communicator issued before it.
  while (!pending_.empty() && pending_.begin()->first <= id) {
    Pending pending = std::move(pending_.begin()->second);
    pending_.erase(pending_.begin());
    MXTRAIN_MPI_CHECK(MPI_Wait(&pending.request, MPI_STATUS_IGNORE));
    if (pending.finish) pending.finish();
  }
}

void MpiCommunicator::barrier() {
  record(CollectiveKind::barrier, Tensor(), 0);
  MXTRAIN_MPI_CHECK(MPI_Barrier(comm_));
}

double MpiCommunicator::all_reduce_scalar(double value, ReduceOp op) {
  double result = 0;
  MXTRAIN_MPI_CHECK(
      MPI_Allreduce(&value, &result, 1, MPI_DOUBLE, op == ReduceOp::max ? MPI_MAX : MPI_SUM, comm_));
  return op == ReduceOp::average ? result / size_ : result;
}

std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key, std::string group_name) {
  MPI_Comm child = MPI_COMM_NULL;
  MXTRAIN_MPI_CHECK(MPI_Comm_split(comm_, color, key, &child));
  auto result = std::make_unique<MpiCommunicator>(child, std::move(group_name));
  result->set_observer(observer_);
  return result;
}

}  // namespace mxtrain
