// The Array: a value-semantic handle on either concrete data (one buffer per addressable shard)
// or a tracer owned by one trace. Operators broadcast like numpy and promote like JAX.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "cjax/device.h"
#include "cjax/dtype.h"
#include "cjax/errors.h"

namespace cjax {

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape&);  // "(2, 3)"

// The abstract value of an array: what tracing sees. `vma` is the set of manual mesh axes the
// value may vary over inside shard_map (docs/shard_map.md §2); empty outside.
struct AbstractValue {
  Shape shape;
  DType dtype = DType::float32;
  bool weak_type = false;
  std::vector<std::string> vma;
  int64_t size() const;
  int ndim() const { return int(shape.size()); }
  std::string str() const;  // jaxpr form: "f32[8,16]", "f32[]"
  bool operator==(const AbstractValue&) const = default;
};

// `None` stands for "no value" in slices and partition specs: Slice(None, 5), P("i", None).
struct NoneT {
  bool operator==(const NoneT&) const = default;
};
inline constexpr NoneT None{};

struct Slice {
  std::optional<int64_t> start, stop;
  int64_t step = 1;
  struct Bound {
    std::optional<int64_t> v;
    Bound(NoneT) {}
    Bound(int64_t x) : v(x) {}
    Bound(int x) : v(x) {}
  };
  Slice() = default;  // the whole axis, like `:`
  Slice(Bound start, Bound stop, int64_t step = 1) : start(start.v), stop(stop.v), step(step) {}
};
struct NewAxisT {};
inline constexpr NewAxisT NewAxis{};
struct EllipsisT {};
inline constexpr EllipsisT Ellipsis{};

class Array;
class ArrayImpl;
class Sharding;
struct Shard;
class AtProxy;

// One entry of an indexing expression: an integer, a Slice, NewAxis, Ellipsis or an integer Array
// (gather semantics) or a boolean Array of concrete value (mask, eager only); or a block index, a
// slice per leading dimension (Shard::index, the index make_array_from_callback passes), which
// x[idx] expands in place as JAX's x[tuple_of_slices].
class Index {
 public:
  Index(int i) : v_(int64_t(i)) {}
  Index(int64_t i) : v_(i) {}
  Index(Slice s) : v_(s) {}
  Index(NewAxisT) : v_(NewAxisT{}) {}
  Index(EllipsisT) : v_(EllipsisT{}) {}
  Index(const Array& a);
  Index(std::vector<Slice> block) : v_(std::move(block)) {}
  const auto& value() const { return v_; }
  // The slices of a block index; ValueError for any other entry.
  const std::vector<Slice>& block() const;

 private:
  std::variant<int64_t, Slice, NewAxisT, EllipsisT, std::shared_ptr<Array>, std::vector<Slice>> v_;
};

class Array {
 public:
  Array() = default;  // an empty handle; using it raises ValueError
  Array(float);       // weakly typed f32 scalar
  Array(double);      // weakly typed f64 scalar: yields to a float array's dtype (x_f32 * 0.5 -> f32)
  Array(int);         // weakly typed i32 scalar
  Array(int64_t);     // weakly typed i64 scalar
  Array(unsigned v) : Array(int64_t(v)) {}       // weakly typed integer scalar
  Array(unsigned long v) : Array(int64_t(v)) {}  // (size_t) weakly typed integer scalar
  Array(long long v) : Array(int64_t(v)) {}
  Array(bool);  // bool scalar (bools are never weak, as in JAX)
  explicit Array(std::shared_ptr<ArrayImpl> impl) : impl_(std::move(impl)) {}

  const Shape& shape() const;
  int ndim() const;
  int64_t size() const;
  DType dtype() const;
  bool weak_type() const;
  const AbstractValue& aval() const;
  bool defined() const { return impl_ != nullptr; }

  template <class T>
  T item() const;  // scalar (size 1) value, converted to T
  template <class T>
  std::vector<T> to_vector() const;  // row-major copy, converted to T

  Array astype(DType) const;
  Array reshape(Shape) const;  // one -1 entry allowed
  Array T() const;             // reverse all axes
  Array operator[](Index) const;
  Array operator[](std::initializer_list<Index>) const;
  AtProxy at(Index) const;
  AtProxy at(std::initializer_list<Index>) const;

  const Sharding& sharding() const;
  std::vector<Shard> addressable_shards() const;
  void block_until_ready() const;
  bool is_ready() const;

  // `if (x)`: a scalar's truth value, like Python's bool(); raises ValueError for size != 1.
  explicit operator bool() const;

  ArrayImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<ArrayImpl>& impl_ptr() const { return impl_; }

 private:
  std::shared_ptr<ArrayImpl> impl_;
};

// JAX's `.at[idx]`: functional updates.
class AtProxy {
 public:
  AtProxy(Array x, std::vector<Index> idx) : x_(std::move(x)), idx_(std::move(idx)) {}
  Array get() const;
  Array set(const Array& v) const;
  Array add(const Array& v) const;
  Array multiply(const Array& v) const;
  Array min(const Array& v) const;
  Array max(const Array& v) const;

 private:
  Array x_;
  std::vector<Index> idx_;
};

// Elementwise operators: numpy broadcasting and JAX type promotion.
Array operator+(const Array&, const Array&);
Array operator-(const Array&, const Array&);
Array operator*(const Array&, const Array&);
Array operator/(const Array&, const Array&);
Array operator%(const Array&, const Array&);
Array operator-(const Array&);
Array operator==(const Array&, const Array&);
Array operator!=(const Array&, const Array&);
Array operator<(const Array&, const Array&);
Array operator<=(const Array&, const Array&);
Array operator>(const Array&, const Array&);
Array operator>=(const Array&, const Array&);
Array operator&(const Array&, const Array&);
Array operator|(const Array&, const Array&);
Array operator^(const Array&, const Array&);
Array operator~(const Array&);
Array& operator+=(Array&, const Array&);
Array& operator-=(Array&, const Array&);
Array& operator*=(Array&, const Array&);
Array& operator/=(Array&, const Array&);

std::ostream& operator<<(std::ostream&, const Array&);  // numpy-style text
std::string to_string(const Array&);                    // same text
std::string repr(const Array&);                         // "Array([1., 2.], dtype=float32)"
std::string debug_string(const Array&);                 // "f32[2,3] [[1. 2. 3.]\n [4. 5. 6.]]" (what gdb shows)

// Shardings. Issue-level detail (NamedSharding, meshes) lives in sharding.h.
class Sharding {
 public:
  virtual ~Sharding() = default;
  virtual std::string str() const = 0;
  virtual std::vector<Device> device_set() const = 0;
};
class SingleDeviceSharding : public Sharding {
 public:
  explicit SingleDeviceSharding(Device d) : device_(d) {}
  Device device() const { return device_; }
  std::string str() const override;
  std::vector<Device> device_set() const override { return {device_}; }

 private:
  Device device_;
};
struct Shard {
  Device device;
  std::vector<Slice> index;  // which block of the global array this shard holds
  Array data;
};

}  // namespace cjax
