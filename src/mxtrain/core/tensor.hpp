// A Tensor is a non-owning view: pointer, shape, strides (in elements), dtype and device.
// Storage is owned by a Buffer (backend/buffer.hpp) allocated through a Backend with a name
// and a lifetime, so every byte of a step is accounted for. Most ops take contiguous tensors;
// views by rows (slice_rows) stay contiguous, transposes do not.
#pragma once
#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "mxtrain/core/dtype.hpp"

namespace mxtrain {

enum class Device : uint8_t {
  cpu,   // host memory
  cuda,  // device memory of the current GPU
  none,  // the dryrun backend: shapes only, no memory behind the pointer
};
std::string_view device_name(Device device);

constexpr int kMaxRank = 4;

struct Shape {
  std::array<int64_t, kMaxRank> dims{};
  int rank = 0;

  Shape() = default;
  Shape(std::initializer_list<int64_t> sizes);
  int64_t operator[](int axis) const { return dims[static_cast<size_t>(axis)]; }
  int64_t numel() const;
  bool operator==(const Shape& other) const;
  bool operator!=(const Shape& other) const { return !(*this == other); }
  std::string str() const;  // "[4, 128, 768]"
};

struct Tensor {
  void* data = nullptr;
  Shape shape;
  std::array<int64_t, kMaxRank> strides{};  // in elements
  DType dtype = DType::f32;
  Device device = Device::cpu;

  Tensor() = default;
  Tensor(void* data, Shape shape, DType dtype, Device device);  // contiguous

  bool defined() const { return shape.rank > 0; }
  int rank() const { return shape.rank; }
  int64_t size(int axis) const { return shape[axis < 0 ? axis + shape.rank : axis]; }
  int64_t numel() const { return shape.numel(); }
  size_t bytes() const { return dtype_bytes(dtype, static_cast<size_t>(numel())); }
  bool is_contiguous() const;
  // Rows = product of all but the last dimension; columns = the last dimension.
  int64_t rows() const { return rank() == 0 ? 0 : numel() / shape[rank() - 1]; }
  int64_t cols() const { return rank() == 0 ? 0 : shape[rank() - 1]; }

  template <typename T> T* ptr() const { return static_cast<T*>(data); }

  // Views. All of them share storage with *this.
  Tensor reshape(Shape new_shape) const;               // contiguous only; same numel
  Tensor flatten_rows() const;                          // [.., cols] -> [rows, cols]
  Tensor slice_rows(int64_t begin, int64_t end) const;  // rows of the 2-D view [rows, cols]
  Tensor slice_flat(int64_t offset, Shape new_shape) const;  // a contiguous sub-range by element offset
  Tensor narrow(int axis, int64_t start, int64_t length) const;
  Tensor transpose(int axis0, int axis1) const;

  std::string describe() const;  // "bf16[8, 1024, 768] on cuda"
};

}  // namespace mxtrain
