// The one list of backends. cuda is registered only when built with CUDA; selecting a backend
// that is not built is an error that says how to get it.
#include <memory>

#include "mxtrain/backend/backend.hpp"
#include "mxtrain/backend/cpu/cpu_backend.hpp"
#include "mxtrain/backend/dryrun/dryrun_backend.hpp"
#include "mxtrain/core/error.hpp"

namespace mxtrain {

#ifdef MXTRAIN_HAVE_CUDA
std::unique_ptr<Backend> create_cuda_backend(const BackendOptions& options);  // backend/cuda/cuda_backend.cpp
bool cuda_device_present();
int cuda_device_capability(int index);
namespace flash_attention_4 {
std::vector<std::string> carried();  // backend/cuda/flash_attention_4.cpp
}
namespace quack_gemm {
bool gated_carried();  // backend/cuda/quack_gemm.cpp
bool gelu_carried();
bool lce_carried();
}
#endif

CarriedKernels carried_kernels() {
  CarriedKernels carried;
#ifdef MXTRAIN_HAVE_CUDA
  carried.flash_attention_4 = flash_attention_4::carried();
  carried.quack_gated_gemm = quack_gemm::gated_carried();
  carried.quack_gelu_gemms = quack_gemm::gelu_carried();
  carried.quack_linear_cross_entropy = quack_gemm::lce_carried();
#endif
  return carried;
}

int cuda_compute_capability(int index) {
#ifdef MXTRAIN_HAVE_CUDA
  return cuda_device_present() ? cuda_device_capability(index) : 0;
#else
  (void)index;
  return 0;
#endif
}

std::vector<std::string> backend_names() {
  std::vector<std::string> names{"cpu"};
#ifdef MXTRAIN_HAVE_CUDA
  names.push_back("cuda");
#endif
  names.push_back("dryrun");
  return names;
}

bool backend_available(std::string_view name) {
  if (name == "cpu" || name == "dryrun") return true;
#ifdef MXTRAIN_HAVE_CUDA
  if (name == "cuda") return cuda_device_present();
#endif
  return false;
}

std::unique_ptr<Backend> create_backend(std::string_view name, const BackendOptions& options) {
  if (name == "cpu") return std::make_unique<CpuBackend>(options.threads);
  if (name == "dryrun") return std::make_unique<DryrunBackend>(options.memory_bytes, options.device_label);
  if (name == "cuda") {
#ifdef MXTRAIN_HAVE_CUDA
    return create_cuda_backend(options);
#else
    throw Error(ErrorKind::unsupported, "this mxtrain was built without the CUDA backend",
                "build with the cuda preset (cmake --preset cuda) on a machine with the CUDA toolkit, or use "
                "--device cpu");
#endif
  }
  throw Error(ErrorKind::config, "unknown backend '" + std::string(name) + "'", "use cpu, cuda or dryrun");
}

}  // namespace mxtrain
