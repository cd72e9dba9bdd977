// Calling TVM-FFI packed functions from C++: what the exported CuTe DSL kernels take
// (FlashAttention-4's, scripts/fa4_export.py; quack's GEMMs, scripts/quack_gemm_export.py):
// strided DLPack views, None, integer and float values, tuples as arrays; the raised error as
// text, and the one symbol the exported objects take from the CuTe DSL's 43 MB runtime library,
// which is not linked. Header-only and free of mxtrain's own types, so that
// flash_attention_4.cpp, quack_gemm.cpp and the standalone probes (bench/fa4_aot_probe.cpp,
// bench/quack_probe.cpp) call the kernels through the same code. Needs the TVM-FFI and DLPack
// headers of scripts/fa4_kernels.sh's folder.
#pragma once
#include <cuda_runtime_api.h>
#include <dlpack/dlpack.h>
#include <tvm/ffi/c_api.h>

#include <cstdio>
#include <initializer_list>
#include <string>
#include <vector>

// Turns a CUDA error code into a raised TVM-FFI error through the setter it is handed. Inline,
// and `used` so that every program including this header emits it (the exported objects refer to
// it; the linker keeps one copy).
extern "C" inline __attribute__((used)) void CuteDSLRT_TVMFFISetRaisedCudaError(
    void (*set)(const char*, const char**, int32_t), int error) {
  if (set == nullptr) return;
  char code[128];
  std::snprintf(code, sizeof code, "%d (%s)", error, cudaGetErrorString(static_cast<cudaError_t>(error)));
  const char* parts[2] = {"CUDA error ", code};
  set("RuntimeError", parts, 2);
}

namespace mxtrain::tvm_ffi {

using Packed = int (*)(void*, const TVMFFIAny*, int32_t, TVMFFIAny*);

// A strided view of CUDA memory as DLPack describes it (up to 6 dimensions); shape and strides
// live beside the DLTensor.
struct View {
  DLTensor t{};
  int64_t dims[6]{}, steps[6]{};
  View(void* data, DLDataType dtype, int device, std::initializer_list<int64_t> shape,
       std::initializer_list<int64_t> strides) {
    int i = 0;
    for (int64_t d : shape) dims[i++] = d;
    i = 0;
    for (int64_t s : strides) steps[i++] = s;
    t.data = data;
    t.device = {kDLCUDA, device};
    t.ndim = static_cast<int32_t>(shape.size());
    t.dtype = dtype;
    t.shape = dims;
    t.strides = steps;
  }
  TVMFFIAny any() {
    TVMFFIAny a{};
    a.type_index = kTVMFFIDLTensorPtr;
    a.v_ptr = &t;
    return a;
  }
};
inline constexpr DLDataType kBf16{kDLBfloat, 16, 1}, kF32{kDLFloat, 32, 1};

inline TVMFFIAny none() {
  TVMFFIAny a{};
  a.type_index = kTVMFFINone;
  return a;
}

inline TVMFFIAny real(double v) {
  TVMFFIAny a{};
  a.type_index = kTVMFFIFloat;
  a.v_float64 = v;
  return a;
}

// The error the last failed call raised, as "kind: message" (and released).
inline std::string raised_error() {
  TVMFFIObjectHandle error = nullptr;
  TVMFFIErrorMoveFromRaised(&error);
  if (error == nullptr) return "no error was raised";
  const TVMFFIErrorCell* cell = TVMFFIErrorGetCellPtr(error);
  std::string text =
      std::string(cell->kind.data, cell->kind.size) + ": " + std::string(cell->message.data, cell->message.size);
  TVMFFIObjectDecRef(error);
  return text;
}

// "" when `fn` ran, else the error it raised.
inline std::string call(Packed fn, std::initializer_list<TVMFFIAny> args) {
  TVMFFIAny result = none();
  if (fn(nullptr, args.begin(), static_cast<int32_t>(args.size()), &result) == 0) return "";
  return raised_error();
}

inline TVMFFIAny integer(int64_t v) {
  TVMFFIAny a{};
  a.type_index = kTVMFFIInt;
  a.v_int64 = v;
  return a;
}

// A TVM-FFI Array of `count` plain values (None, numbers) made by the global "ffi.Array", for the
// tuples the compiled functions take; "" when made (the caller owns *array), else why not.
inline std::string make_array(TVMFFIAny* elements, int count, TVMFFIAny* array) {
  *array = none();
  TVMFFIObjectHandle make = nullptr;
  const TVMFFIByteArray name{"ffi.Array", 9};
  if (TVMFFIFunctionGetGlobal(&name, &make) != 0 || make == nullptr) return "TVM-FFI has no global ffi.Array";
  if (TVMFFIFunctionCall(make, elements, count, array) != 0) return raised_error();
  return "";
}

// A TVM-FFI Array of values some of which are tensors: each element that is a View's any() goes
// in as an ffi.Tensor over that view (`tensors`, in order; the views must outlive the array and
// own nothing). Holds its references until destroyed; `error` is "" when made.
struct TensorArray {
  TVMFFIAny any = none();
  std::string error;
  std::vector<TVMFFIObjectHandle> owned;
  std::vector<DLManagedTensor> managed;
  TensorArray(std::vector<TVMFFIAny> elements, std::initializer_list<View*> tensors) : managed(tensors.size()) {
    auto view = tensors.begin();
    for (size_t i = 0, t = 0; i < elements.size() && error.empty(); ++i) {
      if (elements[i].type_index != kTVMFFIDLTensorPtr) continue;
      if (view == tensors.end()) {
        error = "more tensors than views";
        return;
      }
      DLManagedTensor& m = managed[t++];
      m.dl_tensor = (*view++)->t;
      m.manager_ctx = nullptr;
      m.deleter = [](DLManagedTensor*) {};
      TVMFFIObjectHandle handle = nullptr;
      if (TVMFFITensorFromDLPack(&m, 0, 0, &handle) != 0) {
        error = raised_error();
        return;
      }
      owned.push_back(handle);
      elements[i] = TVMFFIAny{};
      elements[i].type_index = kTVMFFITensor;
      elements[i].v_obj = static_cast<TVMFFIObject*>(handle);
    }
    if (error.empty()) error = make_array(elements.data(), static_cast<int>(elements.size()), &any);
  }
  TensorArray(const TensorArray&) = delete;
  TensorArray& operator=(const TensorArray&) = delete;
  ~TensorArray() {
    if (any.type_index >= kTVMFFIStaticObjectBegin) TVMFFIObjectDecRef(any.v_obj);
    for (TVMFFIObjectHandle h : owned) TVMFFIObjectDecRef(h);
  }
};

// The (None, None) auxiliary-data tuple FlashAttention-4's functions take.
inline std::string make_none_pair(TVMFFIAny* pair) {
  TVMFFIAny elements[2] = {none(), none()};
  return make_array(elements, 2, pair);
}

}  // namespace mxtrain::tvm_ffi
