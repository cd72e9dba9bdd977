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
#endif

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
