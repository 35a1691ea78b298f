// Array creation from host data (numpy::array). Other creation functions live with numpy.
#include <fmt/format.h>

#include "cjax/numpy.h"
#include "core/array/array_impl.h"

namespace cjax::numpy {

template <class T>
Array array(const std::vector<T>& data, Shape shape) {
  if (shape.empty() && data.size() != 1) shape = {int64_t(data.size())};
  if (shape.empty() && data.size() == 1) shape = {1};
  int64_t n = shape_size(shape);
  for (int64_t d : shape)
    if (d < 0) throw ShapeError(fmt::format("array(): negative dimension in shape {}", shape_str(shape)));
  if (n != int64_t(data.size()))
    throw ShapeError(
        fmt::format("array(): {} values cannot fill shape {} ({} elements)", data.size(), shape_str(shape), n));
  // The dtype is the element type's own (std::vector<double> -> float64): a C++ caller names it.
  if constexpr (std::is_same_v<T, bool>) {
    std::vector<uint8_t> bytes(data.begin(), data.end());
    return on_default_device(
        make_from_host(bytes.data(), AbstractValue{shape, DType::bool_, false, {}}, host_device()));
  } else {
    return on_default_device(make_from_host(data.data(), AbstractValue{shape, dtype_v<T>, false, {}}, host_device()));
  }
}
#define CJAX_INSTANTIATE(T) template Array array<T>(const std::vector<T>&, Shape);
CJAX_INSTANTIATE(bool)
CJAX_INSTANTIATE(int8_t)
CJAX_INSTANTIATE(int16_t)
CJAX_INSTANTIATE(int32_t)
CJAX_INSTANTIATE(int64_t)
CJAX_INSTANTIATE(uint8_t)
CJAX_INSTANTIATE(uint32_t)
CJAX_INSTANTIATE(bfloat16_t)
CJAX_INSTANTIATE(float16_t)
CJAX_INSTANTIATE(float)
CJAX_INSTANTIATE(double)
#undef CJAX_INSTANTIATE

}  // namespace cjax::numpy
