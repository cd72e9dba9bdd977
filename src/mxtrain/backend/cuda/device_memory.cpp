#include "mxtrain/backend/cuda/device_memory.hpp"

#include <cuda_runtime_api.h>

#include "mxtrain/backend/cuda/cuda_check.hpp"
#include "mxtrain/core/error.hpp"

namespace mxtrain {

CudaMemorySource::CudaMemorySource(int device_index) : device_index_(device_index) {
  MXTRAIN_CUDA_CHECK(cudaSetDevice(device_index));
  size_t free_bytes = 0, total_bytes = 0;
  MXTRAIN_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  capacity_bytes_ = total_bytes;
  cudaDeviceProp props{};
  MXTRAIN_CUDA_CHECK(cudaGetDeviceProperties(&props, device_index));
  label_ = strf("cuda:%d (%s)", device_index, props.name);
}

void* CudaMemorySource::allocate_segment(size_t bytes) {
  void* pointer = nullptr;
  cudaError_t status = cudaMalloc(&pointer, bytes);
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // not sticky, but clear it so the next checked call does not report it
    return nullptr;
  }
  MXTRAIN_CUDA_CHECK(status);
  return pointer;
}

void CudaMemorySource::free_segment(void* pointer, size_t) {
  // Called from destructors: report a failure but never throw out of one.
  cudaError_t status = cudaFree(pointer);
  if (status != cudaSuccess) cudaGetLastError();
}

}  // namespace mxtrain
