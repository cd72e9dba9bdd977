# The CUDA backend: kernels, cuBLASLt GEMMs, cuDNN attention through cudnn-frontend, NCCL.
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)
# CMake 3.25 (Debian 12) does not know nvcc's C++20 flag and, with CXX_STANDARD 20, refuses to
# generate CUDA targets: tell it the flag.
if(NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
endif()
set(CMAKE_CUDA_STANDARD 20)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
# Which GPUs the kernels are compiled for (MXTRAIN_CUDA_ARCHITECTURES):
#   unset      sm_90, and sm_100 and sm_103 when this nvcc knows them (CUDA >= 12.8 / 12.9): a
#              binary for Hopper and Blackwell, wherever it is built (the `cuda` preset)
#   present    the GPUs this machine has (nvidia-smi's compute capabilities), else sm_90: the
#              `auto` preset of scripts/setup.sh, so a B200 or B300 gets its own code
#   a list     exactly these, e.g. "90;100;103"
set(mxtrain_nvcc_blackwell)
if(CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.8)
  list(APPEND mxtrain_nvcc_blackwell 100)
endif()
if(CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.9)
  list(APPEND mxtrain_nvcc_blackwell 103)
endif()
if(NOT DEFINED MXTRAIN_CUDA_ARCHITECTURES)
  set(MXTRAIN_CUDA_ARCHITECTURES 90 ${mxtrain_nvcc_blackwell})
elseif(MXTRAIN_CUDA_ARCHITECTURES STREQUAL "present")
  execute_process(COMMAND nvidia-smi --query-gpu=compute_cap --format=csv,noheader OUTPUT_VARIABLE gpu_caps
                  RESULT_VARIABLE gpu_query ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
  set(present_architectures)
  if(gpu_query EQUAL 0)
    string(REPLACE "\n" ";" gpu_caps "${gpu_caps}")
    foreach(cap IN LISTS gpu_caps)
      string(REPLACE "." "" cap "${cap}")
      string(STRIP "${cap}" cap)
      if(cap MATCHES "^[0-9]+$")
        list(APPEND present_architectures ${cap})
      endif()
    endforeach()
    list(REMOVE_DUPLICATES present_architectures)
  endif()
  # (A normal variable of the cache entry's name hides the entry "present" from here on.)
  if(present_architectures)
    set(MXTRAIN_CUDA_ARCHITECTURES ${present_architectures})
    message(STATUS "CUDA architectures: ${MXTRAIN_CUDA_ARCHITECTURES} (the GPUs present)")
  else()
    set(MXTRAIN_CUDA_ARCHITECTURES 90)
    message(STATUS "CUDA architectures: 90 (no GPU visible; set MXTRAIN_CUDA_ARCHITECTURES=\"90;100;103\" for "
                   "B200/B300, see docs/building.md)")
  endif()
endif()
set(CMAKE_CUDA_ARCHITECTURES ${MXTRAIN_CUDA_ARCHITECTURES})

find_path(CUDNN_INCLUDE_DIR cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES x86_64-linux-gnu)
find_library(CUDNN_LIBRARY NAMES cudnn HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib PATH_SUFFIXES x86_64-linux-gnu)
find_path(CUDNN_FRONTEND_INCLUDE_DIR cudnn_frontend.h)
find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} $ENV{NCCL_HOME}/include)
find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib $ENV{NCCL_HOME}/lib)
foreach(required CUDNN_INCLUDE_DIR CUDNN_LIBRARY CUDNN_FRONTEND_INCLUDE_DIR NCCL_INCLUDE_DIR NCCL_LIBRARY)
  if(NOT ${required})
    message(FATAL_ERROR "${required} not found. cuDNN, cudnn-frontend (pip nvidia-cudnn-frontend headers) and NCCL "
                        "are needed for the cuda preset; see docs/building.md#building-for-cuda")
  endif()
endforeach()

# What every target with CUDA code needs: the toolkit's headers and libraries, cuDNN, its
# frontend and NCCL. The backend/cuda layer and the NCCL communicator link it.
add_library(mxtrain_cuda_toolkit INTERFACE)
target_include_directories(mxtrain_cuda_toolkit SYSTEM INTERFACE ${CUDNN_INCLUDE_DIR} ${CUDNN_FRONTEND_INCLUDE_DIR}
                                                                 ${NCCL_INCLUDE_DIR})
# cudnn-frontend >= 1.21 compiles kernels at run time through NVRTC.
target_link_libraries(mxtrain_cuda_toolkit INTERFACE CUDA::cudart CUDA::cublasLt CUDA::cublas ${CUDNN_LIBRARY}
                                                     ${NCCL_LIBRARY} CUDA::nvrtc)

# The compile settings of a target with .cu sources.
function(mxtrain_cuda_target target)
  # No --use_fast_math: it flushes FP32 subnormals, and the quantizers must match the CPU reference bit for bit.
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -lineinfo
                                           -Xcompiler=-Wall>)
  set_target_properties(${target} PROPERTIES CUDA_SEPARABLE_COMPILATION OFF POSITION_INDEPENDENT_CODE ON)
endfunction()
