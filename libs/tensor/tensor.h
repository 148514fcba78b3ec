// Tensor: a dense, row-major (contiguous) n-dimensional array on a device.
//
//   Tensor x = Tensor::Empty({256, 1, 28, 28});            // f32 on cpu
//   Tensor y = Tensor::FromVector<float>({1, 2, 3, 4}, {2, 2});
//   Tensor flat = x.Reshape({256, 784});                   // a view
//   absl::StatusOr<Tensor> g = x.To(Device::Cuda(0));
//
// A Tensor is a cheap handle: copying it shares the underlying Storage (like
// a shared_ptr). Views (Reshape, Slice) share storage too; Clone() copies.
// data<T>() returns a pointer in the tensor's device memory, which is host
// memory only for CPU tensors; use ToVector() or To() to read other devices.
//
// Allocation failure in Empty/Zeros is fatal with a message saying what was
// asked and what is held; TryEmpty returns the error instead, for callers that
// can recover (choosing a batch size, say).
//
// Thread-safety: const methods may be called concurrently; writing the
// elements of a tensor while another thread reads them is a data race that
// the caller (or the dependency engine) must order.
#ifndef DTRAIN_LIBS_TENSOR_TENSOR_H_
#define DTRAIN_LIBS_TENSOR_TENSOR_H_

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "libs/tensor/allocator.h"
#include "libs/tensor/device.h"
#include "libs/tensor/dtype.h"

namespace dtrain {

using Shape = absl::InlinedVector<int64_t, 6>;

int64_t NumElements(const Shape& shape);
std::string ShapeToString(const Shape& shape);  // "[256, 1, 28, 28]"

// A block of device memory, returned to its allocator when the last
// reference goes away.
class Storage {
 public:
  Storage(void* data, size_t nbytes, Allocator* allocator)
      : data_(data), nbytes_(nbytes), allocator_(allocator) {}
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return allocator_->device(); }

 private:
  void* data_;
  size_t nbytes_;
  Allocator* allocator_;
};

class Tensor {
 public:
  // An undefined tensor (defined() is false).
  Tensor() = default;

  static absl::StatusOr<Tensor> TryEmpty(const Shape& shape, DType dtype = DType::kF32,
                                         const Device& device = Device::Cpu());
  static Tensor Empty(const Shape& shape, DType dtype = DType::kF32,
                      const Device& device = Device::Cpu());
  static Tensor Zeros(const Shape& shape, DType dtype = DType::kF32,
                      const Device& device = Device::Cpu());
  // A tensor with every element equal to `value` (f32 or i32/i64/u8 by dtype).
  static Tensor Full(const Shape& shape, float value, DType dtype = DType::kF32,
                     const Device& device = Device::Cpu());
  // Copies `values` (which must have NumElements(shape) entries) to `device`.
  template <typename T>
  static Tensor FromVector(const std::vector<T>& values, const Shape& shape,
                           const Device& device = Device::Cpu()) {
    return FromHost(values.data(), values.size(), shape, DTypeOf<T>::value, device);
  }
  // Copies `count` host elements of `dtype` at `data` into a new tensor.
  // REQUIRES: count == NumElements(shape).
  static Tensor FromHost(const void* data, size_t count, const Shape& shape, DType dtype,
                         const Device& device = Device::Cpu());

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  // Size of dimension `d`; negative `d` counts from the end.
  int64_t dim(int d) const;
  int64_t numel() const { return numel_; }
  DType dtype() const { return dtype_; }
  Device device() const;
  size_t nbytes() const { return static_cast<size_t>(numel_) * DTypeSize(dtype_); }

  // Pointer to the first element, in the tensor's device memory.
  void* raw_data() const;
  template <typename T>
  T* data() const;

  // A view with the same elements and a new shape (one dimension may be -1).
  // REQUIRES: the element counts agree.
  Tensor Reshape(const Shape& shape) const;
  // A view of rows [begin, end) along dimension 0.
  Tensor Slice(int64_t begin, int64_t end) const;

  // A deep copy on the same device.
  Tensor Clone() const;
  // A deep copy on `device` (a view of this tensor if it is already there).
  absl::StatusOr<Tensor> To(const Device& device) const;
  // Copies the elements of `src` (same shape and dtype, any device) into this.
  absl::Status CopyFrom(const Tensor& src);
  // Copies the elements to a host vector (converting f16/bf16 to float when T
  // is float). REQUIRES: T matches dtype (or float for f16/bf16), and the copy
  // cannot fail: a host tensor, or device work already synchronized. A failed
  // copy is fatal (it names the tensor and the error) rather than returning
  // zeros; code that must survive a device error uses CopyToHost.
  template <typename T>
  std::vector<T> ToVector() const;
  // Copies all elements to host memory at `dst` (nbytes() bytes).
  absl::Status CopyToHost(void* dst) const;

  // True if both handles view the same storage.
  bool SharesStorageWith(const Tensor& other) const { return storage_ == other.storage_; }
  // Number of handles sharing the storage (for in-place safety checks).
  long storage_use_count() const { return storage_.use_count(); }

  std::string DebugString() const;  // "f32[2, 3] cpu"

 private:
  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;  // bytes
  Shape shape_;
  int64_t numel_ = 0;
  DType dtype_ = DType::kF32;
};

// ---- implementation details ----

namespace internal {
// Dies naming `t` and the error unless `copied` is OK (ToVector).
void CheckCopied(const absl::Status& copied, const Tensor& t);
}  // namespace internal

template <typename T>
T* Tensor::data() const {
  return static_cast<T*>(raw_data());
}

template <typename T>
std::vector<T> Tensor::ToVector() const {
  std::vector<T> out(static_cast<size_t>(numel_));
  if (sizeof(T) == DTypeSize(dtype_)) {
    internal::CheckCopied(CopyToHost(out.data()), *this);
    return out;
  }
  // f16/bf16 -> float.
  std::vector<uint16_t> raw(static_cast<size_t>(numel_));
  internal::CheckCopied(CopyToHost(raw.data()), *this);
  for (size_t i = 0; i < raw.size(); ++i) {
    out[i] = static_cast<T>(dtype_ == DType::kF16 ? HalfToFloat(raw[i]) : BFloat16ToFloat(raw[i]));
  }
  return out;
}

}  // namespace dtrain

#endif  // DTRAIN_LIBS_TENSOR_TENSOR_H_
