// Checked calls into the CUDA runtime, cuBLASLt and cuDNN. A failed call throws mxtrain::Error
// naming the call, its file:line and the library's own error string, so the trainer can still
// flush a checkpoint; nothing here ever exits. Kernel launches are checked with
// MXTRAIN_CUDA_CHECK_LAUNCH(), which reads the launch error without synchronizing.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime_api.h>

namespace mxtrain::cuda_detail {

// cudaErrorMemoryAllocation becomes Error(out_of_memory); everything else Error(system).
[[noreturn]] void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line);
[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* call, const char* file, int line);
// cuDNN status as an int so this header does not need cudnn.h.
[[noreturn]] void throw_cudnn_error(int status, const char* message, const char* call, const char* file, int line);

}  // namespace mxtrain::cuda_detail

#define MXTRAIN_CUDA_CHECK(call)                                                                      \
  do {                                                                                                \
    cudaError_t mxtrain_status_ = (call);                                                             \
    if (mxtrain_status_ != cudaSuccess)                                                               \
      ::mxtrain::cuda_detail::throw_cuda_error(mxtrain_status_, #call, __FILE__, __LINE__);           \
  } while (0)

#define MXTRAIN_CUDA_CHECK_LAUNCH()                                                                   \
  do {                                                                                                \
    cudaError_t mxtrain_status_ = cudaGetLastError();                                                 \
    if (mxtrain_status_ != cudaSuccess)                                                               \
      ::mxtrain::cuda_detail::throw_cuda_error(mxtrain_status_, "kernel launch", __FILE__, __LINE__); \
  } while (0)

#define MXTRAIN_CUBLAS_CHECK(call)                                                                    \
  do {                                                                                                \
    cublasStatus_t mxtrain_status_ = (call);                                                          \
    if (mxtrain_status_ != CUBLAS_STATUS_SUCCESS)                                                     \
      ::mxtrain::cuda_detail::throw_cublas_error(mxtrain_status_, #call, __FILE__, __LINE__);         \
  } while (0)

// Needs <cudnn.h> at the use site.
#define MXTRAIN_CUDNN_CHECK(call)                                                                     \
  do {                                                                                                \
    cudnnStatus_t mxtrain_status_ = (call);                                                           \
    if (mxtrain_status_ != CUDNN_STATUS_SUCCESS)                                                      \
      ::mxtrain::cuda_detail::throw_cudnn_error(static_cast<int>(mxtrain_status_),                   \
                                                cudnnGetErrorString(mxtrain_status_), #call, __FILE__, \
                                                __LINE__);                                            \
  } while (0)
