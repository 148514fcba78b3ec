#include "libs/tensor/tensor.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/base/logging.h"
#include "libs/tensor/stream.h"

namespace dtrain {

int64_t NumElements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeToString(const Shape& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

Storage::~Storage() { allocator_->Deallocate(data_, nbytes_); }

absl::StatusOr<Tensor> Tensor::TryEmpty(const Shape& shape, DType dtype, const Device& device) {
  for (int64_t d : shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("negative dimension in shape ", ShapeToString(shape)));
    }
  }
  absl::StatusOr<Allocator*> alloc = GetAllocator(device);
  if (!alloc.ok()) return alloc.status();
  Tensor t;
  t.shape_ = shape;
  t.numel_ = NumElements(shape);
  t.dtype_ = dtype;
  size_t bytes = t.nbytes();
  absl::StatusOr<void*> p = (*alloc)->Allocate(bytes);
  if (!p.ok()) return p.status();
  t.storage_ = std::make_shared<Storage>(*p, bytes, *alloc);
  return t;
}

Tensor Tensor::Empty(const Shape& shape, DType dtype, const Device& device) {
  absl::StatusOr<Tensor> t = TryEmpty(shape, dtype, device);
  DT_CHECK(t.ok()) << "allocating " << DTypeName(dtype) << ShapeToString(shape) << " on "
                   << device.ToString() << ": " << t.status().message();
  return *std::move(t);
}

Tensor Tensor::Zeros(const Shape& shape, DType dtype, const Device& device) {
  return Full(shape, 0.0f, dtype, device);
}

Tensor Tensor::Full(const Shape& shape, float value, DType dtype, const Device& device) {
  Tensor host = Empty(shape, dtype, Device::Cpu());
  int64_t n = host.numel();
  switch (dtype) {
    case DType::kF32: {
      float* p = host.data<float>();
      for (int64_t i = 0; i < n; ++i) p[i] = value;
      break;
    }
    case DType::kF16:
    case DType::kBF16: {
      uint16_t v = dtype == DType::kF16 ? FloatToHalf(value) : FloatToBFloat16(value);
      uint16_t* p = host.data<uint16_t>();
      for (int64_t i = 0; i < n; ++i) p[i] = v;
      break;
    }
    case DType::kI32: {
      int32_t* p = host.data<int32_t>();
      for (int64_t i = 0; i < n; ++i) p[i] = static_cast<int32_t>(value);
      break;
    }
    case DType::kI64: {
      int64_t* p = host.data<int64_t>();
      for (int64_t i = 0; i < n; ++i) p[i] = static_cast<int64_t>(value);
      break;
    }
    case DType::kU8:
      std::memset(host.raw_data(), static_cast<int>(value), static_cast<size_t>(n));
      break;
  }
  if (device.is_cpu() && device.index == 0) return host;
  absl::StatusOr<Tensor> t = host.To(device);
  DT_CHECK(t.ok()) << t.status().message();
  return *std::move(t);
}

Tensor Tensor::FromHost(const void* data, size_t count, const Shape& shape, DType dtype,
                        const Device& device) {
  DT_CHECK(static_cast<int64_t>(count) == NumElements(shape))
      << count << " values for shape " << ShapeToString(shape);
  Tensor t = Empty(shape, dtype, device);
  absl::Status s = CopyBytes(device, t.raw_data(), Device::Cpu(), data, t.nbytes());
  DT_CHECK(s.ok()) << s.message();
  return t;
}

int64_t Tensor::dim(int d) const {
  int n = ndim();
  if (d < 0) d += n;
  DT_CHECK(d >= 0 && d < n) << "dim " << d << " of " << DebugString();
  return shape_[d];
}

Device Tensor::device() const { return storage_ ? storage_->device() : Device::Cpu(); }

void* Tensor::raw_data() const {
  if (!storage_) return nullptr;
  return static_cast<char*>(storage_->data()) + offset_;
}

Tensor Tensor::Reshape(const Shape& shape) const {
  Shape s = shape;
  int infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      DT_CHECK(infer < 0) << "two -1 dimensions in reshape to " << ShapeToString(shape);
      infer = static_cast<int>(i);
    } else {
      known *= s[i];
    }
  }
  if (infer >= 0) {
    DT_CHECK(known > 0 && numel_ % known == 0)
        << "cannot reshape " << DebugString() << " to " << ShapeToString(shape);
    s[infer] = numel_ / known;
  }
  DT_CHECK(NumElements(s) == numel_)
      << "cannot reshape " << DebugString() << " to " << ShapeToString(shape);
  Tensor t = *this;
  t.shape_ = s;
  return t;
}

Tensor Tensor::Slice(int64_t begin, int64_t end) const {
  DT_CHECK(ndim() >= 1 && begin >= 0 && begin <= end && end <= shape_[0])
      << "slice [" << begin << ", " << end << ") of " << DebugString();
  int64_t row = shape_[0] == 0 ? 0 : numel_ / shape_[0];
  Tensor t = *this;
  t.shape_[0] = end - begin;
  t.numel_ = row * (end - begin);
  t.offset_ = offset_ + static_cast<size_t>(begin * row) * DTypeSize(dtype_);
  return t;
}

Tensor Tensor::Clone() const {
  Tensor t = Empty(shape_, dtype_, device());
  absl::Status s = t.CopyFrom(*this);
  DT_CHECK(s.ok()) << s.message();
  return t;
}

absl::StatusOr<Tensor> Tensor::To(const Device& device) const {
  if (device == this->device()) return *this;
  absl::StatusOr<Tensor> t = TryEmpty(shape_, dtype_, device);
  if (!t.ok()) return t.status();
  absl::Status s = t->CopyFrom(*this);
  if (!s.ok()) return s;
  return t;
}

absl::Status Tensor::CopyFrom(const Tensor& src) {
  if (src.shape_ != shape_ || src.dtype_ != dtype_) {
    return absl::InvalidArgumentError(
        absl::StrCat("CopyFrom: ", src.DebugString(), " into ", DebugString()));
  }
  return CopyBytes(device(), raw_data(), src.device(), src.raw_data(), nbytes());
}

absl::Status Tensor::CopyToHost(void* dst) const {
  absl::Status s = CopyBytes(Device::Cpu(), dst, device(), raw_data(), nbytes());
  if (!s.ok()) return s;
  if (!device().is_cpu()) {
    Stream* stream = DefaultStream(device());
    if (stream != nullptr) return stream->Synchronize();
  }
  return absl::OkStatus();
}

std::string Tensor::DebugString() const {
  if (!defined()) return "undefined";
  return absl::StrCat(DTypeName(dtype_), ShapeToString(shape_), " ", device().ToString());
}

namespace internal {

void CheckCopied(const absl::Status& copied, const Tensor& t) {
  DT_CHECK(copied.ok()) << "ToVector of " << t.DebugString() << ": " << copied.ToString()
                        << " (use CopyToHost where a failed copy must be handled)";
}

}  // namespace internal

}  // namespace dtrain
