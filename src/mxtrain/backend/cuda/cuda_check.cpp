// The throwing halves of the check macros: one message format for every library.
#include "mxtrain/backend/cuda/cuda_check.hpp"

#include "mxtrain/core/error.hpp"

namespace mxtrain::cuda_detail {

void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line) {
  cudaGetLastError();  // clear a sticky-free error so later calls are not blamed for this one
  std::string what = strf("CUDA call %s failed at %s:%d: %s (%s)", call, file, line, cudaGetErrorString(status),
                          cudaGetErrorName(status));
  if (status == cudaErrorMemoryAllocation) {
    throw Error(ErrorKind::out_of_memory, what,
                "lower train.micro_batch_size or train.seq_len, or turn on activation checkpointing; "
                "`mxtrain plan` shows what fits");
  }
  throw Error(ErrorKind::system, what,
              "check the GPU with nvidia-smi; rerun with CUDA_LAUNCH_BLOCKING=1 to find the failing kernel");
}

void throw_cublas_error(cublasStatus_t status, const char* call, const char* file, int line) {
  std::string what = strf("cuBLAS call %s failed at %s:%d: %s (%s)", call, file, line, cublasGetStatusString(status),
                          cublasGetStatusName(status));
  if (status == CUBLAS_STATUS_ALLOC_FAILED) {
    throw Error(ErrorKind::out_of_memory, what, "free GPU memory: lower the micro-batch size or sequence length");
  }
  throw Error(ErrorKind::system, what, "check the GEMM shapes and dtypes in the message; report it with the config");
}

void throw_cudnn_error(int status, const char* message, const char* call, const char* file, int line) {
  throw Error(ErrorKind::system, strf("cuDNN call %s failed at %s:%d: %s (status %d)", call, file, line, message, status),
              "check that the cuDNN library found at run time (9.x) matches the one mxtrain was built with");
}

}  // namespace mxtrain::cuda_detail
