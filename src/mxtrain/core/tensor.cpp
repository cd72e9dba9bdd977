#include "mxtrain/core/tensor.hpp"

#include "mxtrain/core/checked.hpp"
#include "mxtrain/core/error.hpp"

namespace mxtrain {

std::string_view device_name(Device device) {
  switch (device) {
    case Device::cpu: return "cpu";
    case Device::cuda: return "cuda";
    case Device::none: return "dryrun";
  }
  return "?";
}

Shape::Shape(std::initializer_list<int64_t> sizes) {
  MXTRAIN_ASSERT(sizes.size() <= kMaxRank, "rank %zu > %d", sizes.size(), kMaxRank);
  for (int64_t size : sizes) dims[static_cast<size_t>(rank++)] = size;
}

int64_t Shape::numel() const {
  if (rank == 0) return 0;
  // Shapes come from user-sized dimensions: a product past 2^56 elements (whose bytes, at up to
  // 32 bits each, would not fit in 64 bits) is reported, not wrapped.
  constexpr int64_t kMaxElements = int64_t{1} << 56;
  int64_t count = 1;
  for (int axis = 0; axis < rank; ++axis) {
    count = checked_mul(count, dims[static_cast<size_t>(axis)], "a tensor's element count");
    if (count > kMaxElements)
      throw Error(ErrorKind::config, "a tensor of shape " + str() + " has more than 2^56 elements",
                  "the model or batch dimensions are far too large: lower model.hidden, model.ffn_hidden, "
                  "model.vocab_size, train.micro_batch_size or train.seq_len");
  }
  return count;
}

bool Shape::operator==(const Shape& other) const {
  if (rank != other.rank) return false;
  for (int axis = 0; axis < rank; ++axis)
    if (dims[static_cast<size_t>(axis)] != other.dims[static_cast<size_t>(axis)]) return false;
  return true;
}

std::string Shape::str() const {
  std::string text = "[";
  for (int axis = 0; axis < rank; ++axis) {
    if (axis) text += ", ";
    text += std::to_string(dims[static_cast<size_t>(axis)]);
  }
  return text + "]";
}

static void set_contiguous_strides(Tensor& tensor) {
  int64_t stride = 1;
  for (int axis = tensor.shape.rank - 1; axis >= 0; --axis) {
    tensor.strides[static_cast<size_t>(axis)] = stride;
    stride *= tensor.shape[axis];
  }
}

Tensor::Tensor(void* data_, Shape shape_, DType dtype_, Device device_)
    : data(data_), shape(shape_), dtype(dtype_), device(device_) {
  set_contiguous_strides(*this);
}

bool Tensor::is_contiguous() const {
  int64_t stride = 1;
  for (int axis = shape.rank - 1; axis >= 0; --axis) {
    if (shape[axis] != 1 && strides[static_cast<size_t>(axis)] != stride) return false;
    stride *= shape[axis];
  }
  return true;
}

static void* offset_pointer(void* data, DType dtype, int64_t elements) {
  if (data == nullptr) return nullptr;
  MXTRAIN_ASSERT(dtype_bits(dtype) >= 8 || elements % 2 == 0, "FP4 views must start on a byte");
  return static_cast<char*>(data) + dtype_bytes(dtype, static_cast<size_t>(elements));
}

Tensor Tensor::reshape(Shape new_shape) const {
  MXTRAIN_ASSERT(is_contiguous(), "reshape of a non-contiguous tensor %s", describe().c_str());
  MXTRAIN_ASSERT(new_shape.numel() == numel(), "reshape %s -> %s", shape.str().c_str(), new_shape.str().c_str());
  return Tensor(data, new_shape, dtype, device);
}

Tensor Tensor::flatten_rows() const { return reshape(Shape{rows(), cols()}); }

Tensor Tensor::slice_rows(int64_t begin, int64_t end) const {
  MXTRAIN_ASSERT(is_contiguous() && 0 <= begin && begin <= end && end <= rows(), "slice_rows(%lld, %lld) of %s",
                 static_cast<long long>(begin), static_cast<long long>(end), describe().c_str());
  return Tensor(offset_pointer(data, dtype, begin * cols()), Shape{end - begin, cols()}, dtype, device);
}

Tensor Tensor::slice_flat(int64_t offset, Shape new_shape) const {
  MXTRAIN_ASSERT(is_contiguous() && offset >= 0 && offset + new_shape.numel() <= numel(),
                 "slice_flat(%lld, %s) of %s", static_cast<long long>(offset), new_shape.str().c_str(),
                 describe().c_str());
  return Tensor(offset_pointer(data, dtype, offset), new_shape, dtype, device);
}

Tensor Tensor::narrow(int axis, int64_t start, int64_t length) const {
  MXTRAIN_ASSERT(axis >= 0 && axis < rank() && start >= 0 && start + length <= shape[axis], "narrow");
  Tensor view = *this;
  view.data = offset_pointer(data, dtype, start * strides[static_cast<size_t>(axis)]);
  view.shape.dims[static_cast<size_t>(axis)] = length;
  return view;
}

Tensor Tensor::transpose(int axis0, int axis1) const {
  MXTRAIN_ASSERT(axis0 >= 0 && axis1 >= 0 && axis0 < rank() && axis1 < rank(), "transpose");
  Tensor view = *this;
  std::swap(view.shape.dims[static_cast<size_t>(axis0)], view.shape.dims[static_cast<size_t>(axis1)]);
  std::swap(view.strides[static_cast<size_t>(axis0)], view.strides[static_cast<size_t>(axis1)]);
  return view;
}

std::string Tensor::describe() const {
  return std::string(dtype_name(dtype)) + shape.str() + " on " + std::string(device_name(device));
}

}  // namespace mxtrain
