// cjax::random — JAX's threefry2x32 PRNG built from lax ops (docs/prng.md). Both of JAX's schemes
// are implemented: "partitionable" (default; element i only depends on i) and the legacy one.
//
// cjax has no uint16/uint64 dtypes, so internally random bits of width w are held as:
//   w = 8: uint8, w = 16: uint32 holding values < 2^16, w = 32: uint32, w = 64: int64 bit patterns.
// Unsigned arithmetic on those (randint) masks to 16 bits, or uses unsigned comparisons and an
// unsigned remainder built from signed int64 ops, so values equal JAX's bit for bit.
#include "cjax/random.h"

#include <fmt/format.h>

#include <atomic>
#include <cmath>
#include <limits>

#include "cjax/lax.h"
#include "cjax/numpy.h"
#include "core/array/array_impl.h"
#include "core/array/util.h"
#include "core/array/visit_dtype.h"

namespace cjax {

namespace {
std::atomic<bool> g_partitionable{true};
}  // namespace

namespace config {
void set_threefry_partitionable(bool enabled) { g_partitionable.store(enabled); }
bool threefry_partitionable() { return g_partitionable.load(); }
}  // namespace config

namespace random {
namespace {

namespace jnp = cjax::numpy;

// ---- constants ----
template <class T>
Array cst(T v) {
  Array a = make_uninitialized(AbstractValue{{}, dtype_v<T>, false, {}}, host_device());
  *data_ptr<T>(a) = v;
  return a;
}
Array u32c(uint32_t v) { return cst<uint32_t>(v); }
// A rank-0 constant of an integer dtype `d` holding `v` (converted with wrap-around).
Array int_const(__int128 v, DType d) {
  return visit_dtype(d, [&](auto tag) -> Array {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_integral_v<T>)
      return cst<T>(T(v));
    else
      throw DTypeError(fmt::format("internal: int_const of {}", dtype_name(d)));
  });
}
struct IntRange {
  __int128 lo, hi;
};
IntRange iinfo(DType d) {
  switch (d) {
    case DType::bool_: return {0, 1};
    case DType::int8: return {INT8_MIN, INT8_MAX};
    case DType::int16: return {INT16_MIN, INT16_MAX};
    case DType::int32: return {INT32_MIN, INT32_MAX};
    case DType::int64: return {INT64_MIN, INT64_MAX};
    case DType::uint8: return {0, UINT8_MAX};
    case DType::uint32: return {0, UINT32_MAX};
    default: throw DTypeError(fmt::format("internal: iinfo of {}", dtype_name(d)));
  }
}
int int_bits(DType d) { return int(itemsize(d)) * 8; }

std::string aval_str(const Array& a) { return a.aval().str(); }

// ---- key validation ----
void check_key(std::string_view fn, const Array& key, bool single = true) {
  if (!key.defined()) throw ValueError(fmt::format("random.{}: the key is an empty Array handle", fn));
  if (key.dtype() != DType::uint32)
    throw DTypeError(
        fmt::format("random.{}: a PRNG key must be a uint32 array of shape (..., 2) as returned by "
                    "random.key(seed) or random.split, got dtype {} ({})",
                    fn, dtype_name(key.dtype()), aval_str(key)));
  if (key.ndim() < 1 || key.shape().back() != 2)
    throw ShapeError(
        fmt::format("random.{}: a PRNG key must be a uint32 array of shape (..., 2) as returned by "
                    "random.key(seed) or random.split, got shape {} ({})",
                    fn, shape_str(key.shape()), aval_str(key)));
  if (single && key.ndim() != 1)
    throw ShapeError(
        fmt::format("random.{} accepts a single key of shape (2,), but was given a key array of shape {}; "
                    "use vmap to map over a batch of keys",
                    fn, shape_str(key.shape())));
}
void check_shape(std::string_view fn, const Shape& shape) {
  for (int64_t d : shape)
    if (d < 0) throw ShapeError(fmt::format("random.{}: shape {} has a negative dimension", fn, shape_str(shape)));
}

struct KeyPair {
  Array k0, k1;  // rank-0 uint32
};
KeyPair unpack(const Array& key) {
  return {lax::reshape(lax::slice(key, {0}, {1}), {}), lax::reshape(lax::slice(key, {1}, {2}), {})};
}
// Stacks two u32 arrays of one shape along a new last axis.
Array stack_last(const Array& a, const Array& b) {
  Shape s = a.shape();
  Shape s1 = s;
  s1.push_back(1);
  return lax::concatenate({lax::reshape(a, s1), lax::reshape(b, s1)}, int64_t(s.size()));
}

// Flat uint32 counters [0, n); n must be < 2^32.
Array iota_u32(int64_t n) { return lax::iota(DType::uint32, n); }

// The (hi32, lo32) words of the flat indices [0, n): hi is a rank-0 zero when n <= 2^32.
std::pair<Array, Array> iota_2x32(int64_t n) {
  if (n <= (int64_t(1) << 32)) return {u32c(0), n == 0 ? lax::iota(DType::uint32, 0) : iota_u32(n)};
  Array i = lax::iota(DType::int64, n);
  Array hi = lax::convert_element_type(lax::shift_right_logical(i, cst<int64_t>(32)), DType::uint32);
  Array lo = lax::convert_element_type(i, DType::uint32);
  return {hi, lo};
}

// The legacy vector helper H(key, counts): pairs counts i and i + M (docs/prng.md §1).
Array threefry_2x32(const KeyPair& k, Array counts) {
  int64_t n = counts.size();
  bool odd = n % 2 == 1;
  if (odd) counts = lax::concatenate({counts, lax::reshape(u32c(0), {1})}, 0);
  int64_t m = (n + (odd ? 1 : 0)) / 2;
  Array x0 = lax::slice(counts, {0}, {m}), x1 = lax::slice(counts, {m}, {2 * m});
  auto [y0, y1] = lax::threefry2x32(k.k0, k.k1, x0, x1);
  Array out = lax::concatenate({y0, y1}, 0);
  return odd ? lax::slice(out, {0}, {n}) : out;
}

Array split_impl(const Array& key, const Shape& shape) {
  int64_t n = shape_size(shape);
  KeyPair k = unpack(key);
  Shape out_shape = shape;
  out_shape.push_back(2);
  if (config::threefry_partitionable()) {
    auto [hi, lo] = iota_2x32(n);
    auto [a, b] = lax::threefry2x32(k.k0, k.k1, hi, lo);
    return lax::reshape(stack_last(a, b), out_shape);
  }
  if (2 * n >= (int64_t(1) << 32))
    throw ValueError(fmt::format("random.split: {} keys exceed the legacy scheme's 2^31 - 1 limit", n));
  return lax::reshape(threefry_2x32(k, iota_u32(2 * n)), out_shape);
}

// Random bits of `width` in the internal representation (see the file comment), flat [N].
Array random_bits_flat(const Array& key, int width, int64_t n) {
  KeyPair k = unpack(key);
  if (config::threefry_partitionable()) {
    auto [hi, lo] = iota_2x32(n);
    auto [a, b] = lax::threefry2x32(k.k0, k.k1, hi, lo);
    switch (width) {
      case 64: {
        Array h = lax::convert_element_type(a, DType::int64), l = lax::convert_element_type(b, DType::int64);
        return lax::bitwise_or(lax::shift_left(h, cst<int64_t>(32)), l);
      }
      case 32: return lax::bitwise_xor(a, b);
      case 16: return lax::bitwise_and(lax::bitwise_xor(a, b), u32c(0xFFFFu));
      default: return lax::convert_element_type(lax::bitwise_xor(a, b), DType::uint8);
    }
  }
  // Legacy: ceil(width * n / 32) words from H, in blocks of at most 2^32 - 1 words.
  int64_t max_count = (int64_t(width) * n + 31) / 32;
  constexpr int64_t kBlock = int64_t(UINT32_MAX);
  int64_t nblocks = max_count / kBlock, rem = max_count % kBlock;
  Array words;
  if (nblocks == 0) {
    words = threefry_2x32(k, iota_u32(rem));
  } else {
    Array keys = split_impl(key, {nblocks + 1});
    std::vector<Array> parts;
    for (int64_t j = 0; j <= nblocks; ++j) {
      Array kj = lax::reshape(lax::slice(keys, {j, 0}, {j + 1, 2}), {2});
      parts.push_back(threefry_2x32(unpack(kj), iota_u32(j < nblocks ? kBlock : rem)));
    }
    words = lax::concatenate(parts, 0);
  }
  if (width == 32) return words;
  if (width == 64) {
    Array h = lax::convert_element_type(lax::slice(words, {0}, {n}), DType::int64);
    Array l = lax::convert_element_type(lax::slice(words, {n}, {2 * n}), DType::int64);
    return lax::bitwise_or(lax::shift_left(h, cst<int64_t>(32)), l);
  }
  // 8 / 16: k = 32 / width values per word, little-endian within the word.
  int64_t per = 32 / width;
  Array wb = lax::broadcast_in_dim(words, {max_count, per}, {0});
  Array sh = lax::mul(lax::broadcasted_iota(DType::uint32, {max_count, per}, 1), u32c(uint32_t(width)));
  Array v = lax::bitwise_and(lax::shift_right_logical(wb, sh), u32c(width == 8 ? 0xFFu : 0xFFFFu));
  v = lax::slice(lax::reshape(v, {max_count * per}), {0}, {n});
  return width == 8 ? lax::convert_element_type(v, DType::uint8) : v;
}
Array random_bits(const Array& key, int width, const Shape& shape) {
  return lax::reshape(random_bits_flat(key, width, shape_size(shape)), shape);
}

// Converts a float value of dtype `d` to the array's dtype and broadcasts it to `shape` (rank-0 stays rank-0).
Array bcast_param(std::string_view fn, std::string_view what, const Array& v, DType d, const Shape& shape) {
  Array c = lax::convert_element_type(v, d);
  if (c.ndim() == 0) return c;
  Shape b;
  try {
    b = jnp::broadcast_shapes({shape, c.shape()});
  } catch (const Error&) {
    b.clear();
  }
  if (b != shape)
    throw ShapeError(fmt::format("random.{}: {} of shape {} does not broadcast to the requested shape {}", fn, what,
                                 shape_str(c.shape()), shape_str(shape)));
  return jnp::broadcast_to(c, shape);
}

void check_float(std::string_view fn, DType d) {
  if (!is_floating(d))
    throw DTypeError(
        fmt::format("random.{} only accepts floating-point dtypes (float32, float64, bfloat16, "
                    "float16), got {}",
                    fn, dtype_name(d)));
}

// Bit pattern of 1.0 and a right-shifted mantissa, as an array of `d`'s width, bitcast to `d`.
Array uniform_01(const Array& key, const Shape& shape, DType d) {
  int nmant = mantissa_bits(d);
  int nbits = int(itemsize(d)) * 8;
  int rng_bits = nmant < 8 ? 8 : nbits;
  Array bits = random_bits(key, rng_bits, shape);
  Array fbits;
  switch (d) {
    case DType::float32:
      fbits = lax::bitcast_convert_type(lax::bitwise_or(lax::shift_right_logical(bits, u32c(uint32_t(32 - nmant))),
                                                        u32c(0x3F800000u)),
                                        d);
      break;
    case DType::float64:
      fbits = lax::bitcast_convert_type(lax::bitwise_or(lax::shift_right_logical(bits, cst<int64_t>(64 - nmant)),
                                                        cst<int64_t>(0x3FF0000000000000LL)),
                                        d);
      break;
    case DType::float16:
    case DType::bfloat16: {
      // rng_bits (8 for bf16, 16 for f16) widened to 16 bits; all values fit in int16 (< 0x4000).
      Array w = rng_bits == 8 ? lax::convert_element_type(bits, DType::uint32) : bits;
      uint32_t one = d == DType::float16 ? 0x3C00u : 0x3F80u;
      Array v = lax::bitwise_or(lax::shift_right_logical(w, u32c(uint32_t(rng_bits - nmant))), u32c(one));
      fbits = lax::bitcast_convert_type(lax::convert_element_type(v, DType::int16), d);
      break;
    }
    default: check_float("uniform", d);
  }
  return lax::sub(fbits, make_scalar(1.0, d));
}

Array uniform_impl(std::string_view fn, const Array& key, const Shape& shape, DType d, const Array& minval,
                   const Array& maxval) {
  check_float(fn, d);
  Array lo = bcast_param(fn, "minval", minval, d, shape);
  Array hi = bcast_param(fn, "maxval", maxval, d, shape);
  Array f = uniform_01(key, shape, d);
  Array r = lax::add(lax::mul(f, lax::sub(hi, lo)), lo);
  return lax::max(lo, r);
}

// nextafter(x, +inf) (up) or nextafter(x, -inf) of a float array; bit-exact for the half types too.
Array next_toward(const Array& x, bool up) {
  DType d = x.dtype();
  if (d == DType::float32 || d == DType::float64) {
    double inf = std::numeric_limits<double>::infinity();
    return lax::nextafter(x, jnp::full_like(x, up ? inf : -inf));
  }
  // 16-bit floats: step the sign-magnitude bit pattern.
  Array b = lax::bitcast_convert_type(x, DType::int16);
  Array zero = jnp::zeros_like(x);
  Array pos = lax::gt(x, zero), neg = lax::lt(x, zero);
  Array one = jnp::ones_like(b);
  Array away = lax::add(b, one), toward0 = lax::sub(b, one);  // magnitude +1 / -1 (sign bit unchanged)
  // up: positive -> away from 0, negative -> toward 0; down: the reverse. Zero -> +/- smallest subnormal.
  Array stepped = lax::select(pos, up ? away : toward0, up ? toward0 : away);
  Array tiny = jnp::full_like(b, cst<int16_t>(up ? int16_t(0x0001) : int16_t(-32767)));  // +/- 0x0001
  Array nb = lax::select(lax::bitwise_or(pos, neg), stepped, tiny);
  Array r = lax::bitcast_convert_type(nb, d);
  // NaN stays NaN; an infinity in the direction of travel stays.
  double inf = std::numeric_limits<double>::infinity();
  Array keep = lax::bitwise_or(lax::ne(x, x), lax::eq(x, jnp::full_like(x, up ? inf : -inf)));
  return lax::select(keep, x, r);
}

// ---- unsigned helpers for randint (internal representation by width) ----
struct UOps {
  int nbits;
  DType rep;  // uint8, uint32 (16/32 bits) or int64
  Array c(uint64_t v) const {
    switch (rep) {
      case DType::uint8: return cst<uint8_t>(uint8_t(v));
      case DType::uint32: return u32c(uint32_t(v));
      default: return cst<int64_t>(int64_t(v));
    }
  }
  Array mask16(const Array& x) const { return nbits == 16 ? lax::bitwise_and(x, u32c(0xFFFFu)) : x; }
  Array add(const Array& a, const Array& b) const { return mask16(lax::add(a, b)); }
  Array mul(const Array& a, const Array& b) const { return mask16(lax::mul(a, b)); }
  Array flip(const Array& x) const { return lax::bitwise_xor(x, cst<int64_t>(INT64_MIN)); }
  Array uge(const Array& a, const Array& b) const {  // unsigned a >= b
    return rep == DType::int64 ? lax::ge(flip(a), flip(b)) : lax::ge(a, b);
  }
  // Unsigned remainder with XLA's x rem 0 = x.
  Array rem(const Array& x, const Array& s) const {
    if (rep != DType::int64) return lax::rem(x, s);
    Array zero = jnp::zeros_like(s);
    Array s_big = lax::lt(s, zero);  // s >= 2^63 as unsigned
    Array r_big = lax::select(uge(x, s), lax::sub(x, s), x);
    Array s_safe = lax::select(lax::le(s, zero), jnp::ones_like(s), s);
    Array q = lax::shift_left(lax::div(lax::shift_right_logical(x, jnp::ones_like(x)), s_safe), jnp::ones_like(x));
    Array r = lax::sub(x, lax::mul(q, s_safe));
    r = lax::select(uge(r, s_safe), lax::sub(r, s_safe), r);
    return lax::select(lax::eq(s, zero), x, lax::select(s_big, r_big, r));
  }
  // dtype value -> unsigned representation of the same bits.
  Array to_unsigned(const Array& x) const {
    switch (nbits) {
      case 8: return lax::convert_element_type(x, DType::uint8);
      case 16:
        return lax::bitwise_and(lax::convert_element_type(lax::convert_element_type(x, DType::int32), DType::uint32),
                                u32c(0xFFFFu));
      case 32: return lax::convert_element_type(x, DType::uint32);
      default: return lax::convert_element_type(x, DType::int64);
    }
  }
};

// JAX's _convert_and_clip_integer: clamp `val` to the intersection of its range and `d`'s, convert to d.
Array convert_and_clip_integer(const Array& val, DType d) {
  IntRange a = iinfo(d), b = iinfo(val.dtype());
  __int128 lo = std::max(a.lo, b.lo), hi = std::min(a.hi, b.hi);
  Array c = lax::clamp(int_const(lo, val.dtype()), val, int_const(hi, val.dtype()));
  return lax::convert_element_type(c, d);
}

Array as_int_bound(const Array& v) {
  if (is_integer(v.dtype())) return v.weak_type() ? lax::convert_element_type(v, v.dtype()) : v;
  // JAX: non-integer bounds are cast with astype(int), i.e. int32 in the default x32 mode.
  return lax::convert_element_type(v, DType::int32);
}

// Shuffle along `axis` by JAX's rounds of sort-by-random-bits.
Array shuffle(Array key, Array x, int64_t axis) {
  constexpr double exponent = 3;
  double uint32max = double(UINT32_MAX);
  int64_t n = x.size();
  int num_rounds = int(std::ceil(exponent * std::log(double(std::max<int64_t>(1, n))) / std::log(uint32max)));
  for (int r = 0; r < num_rounds; ++r) {
    Array keys = split_impl(key, {2});
    key = lax::reshape(lax::slice(keys, {0, 0}, {1, 2}), {2});
    Array subkey = lax::reshape(lax::slice(keys, {1, 0}, {2, 2}), {2});
    Array sort_keys = random_bits(subkey, 32, x.shape());
    x = lax::sort({sort_keys, x}, axis, /*is_stable=*/true, /*num_keys=*/1)[1];
  }
  return x;
}

}  // namespace

// ---- keys ----
Array key(uint64_t seed) {
  uint32_t v[2] = {uint32_t(seed >> 32), uint32_t(seed & 0xFFFFFFFFu)};
  return on_default_device(make_from_host(v, AbstractValue{{2}, DType::uint32, false, {}}, host_device()));
}

Array key(const Array& seed) {
  if (!seed.defined()) throw ValueError("random.key: the seed is an empty Array handle");
  if (seed.ndim() != 0)
    throw ShapeError(fmt::format("random.key: the seed must be a scalar, got shape {}", shape_str(seed.shape())));
  if (!is_integer(seed.dtype()))
    throw DTypeError(fmt::format("random.key: the seed must be an integer, got {}", dtype_name(seed.dtype())));
  Array hi, lo;
  if (seed.dtype() == DType::int64) {
    hi = lax::convert_element_type(lax::shift_right_logical(seed, cst<int64_t>(32)), DType::uint32);
    lo = lax::convert_element_type(seed, DType::uint32);
  } else {
    // 32-bit or narrower: shift_right_logical by 32 gives 0 (XLA), so the high word is 0.
    hi = u32c(0);
    lo = lax::convert_element_type(seed, DType::uint32);
  }
  return lax::concatenate({lax::reshape(hi, {1}), lax::reshape(lo, {1})}, 0);
}

Array key_data(const Array& key) {
  check_key("key_data", key, /*single=*/false);
  return key;
}

Array split(const Array& key, int64_t num) {
  check_key("split", key);
  if (num <= 0) throw ValueError(fmt::format("random.split: num must be a positive number of keys, got {}", num));
  return split_impl(key, {num});
}

Array split(const Array& key, const Shape& shape) {
  check_key("split", key);
  check_shape("split", shape);
  return split_impl(key, shape);
}

Array fold_in(const Array& key, int64_t data) { return fold_in(key, cst<uint32_t>(uint32_t(uint64_t(data)))); }

Array fold_in(const Array& key, const Array& data) {
  check_key("fold_in", key);
  if (!data.defined()) throw ValueError("random.fold_in: data is an empty Array handle");
  if (data.ndim() != 0)
    throw ShapeError(
        fmt::format("random.fold_in: data must be a scalar integer, got shape {}", shape_str(data.shape())));
  if (!is_integer(data.dtype()))
    throw DTypeError(fmt::format("random.fold_in: data must be an integer, got {}", dtype_name(data.dtype())));
  KeyPair k = unpack(key);
  // jnp.uint32(data), then H(key, [hi32, lo32]) = T(key; 0, data) for a 32-bit value.
  Array d = lax::convert_element_type(data, DType::uint32);
  auto [a, b] = lax::threefry2x32(k.k0, k.k1, u32c(0), d);
  return lax::concatenate({lax::reshape(a, {1}), lax::reshape(b, {1})}, 0);
}

// ---- samplers ----
Array bits(const Array& key, const Shape& shape, DType dtype) {
  check_key("bits", key);
  check_shape("bits", shape);
  switch (dtype) {
    case DType::uint8: return random_bits(key, 8, shape);
    case DType::uint32: return random_bits(key, 32, shape);
    case DType::int16:
      return lax::convert_element_type(random_bits(key, 16, shape), DType::int16);  // wraps: the 16-bit pattern
    case DType::int64: return random_bits(key, 64, shape);
    default:
      throw DTypeError(
          fmt::format("random.bits: dtype must be uint8 or uint32, or int16 / int64 for the 16- and "
                      "64-bit patterns (cjax has no uint16/uint64), got {}",
                      dtype_name(dtype)));
  }
}

Array uniform(const Array& key, const Shape& shape, DType dtype, const Array& minval, const Array& maxval) {
  check_key("uniform", key);
  check_shape("uniform", shape);
  return uniform_impl("uniform", key, shape, dtype, minval, maxval);
}

Array normal(const Array& key, const Shape& shape, DType dtype) {
  check_key("normal", key);
  check_shape("normal", shape);
  check_float("normal", dtype);
  // lo = nextafter(-1, 0) in dtype = -(1 - 2^-(nmant + 1)).
  double lo = -(1.0 - std::ldexp(1.0, -(mantissa_bits(dtype) + 1)));
  Array u = uniform_impl("normal", key, shape, dtype, make_scalar(lo, dtype), make_scalar(1.0, dtype));
  return lax::mul(make_scalar(std::sqrt(2.0), dtype), lax::erf_inv(u));
}

Array truncated_normal(const Array& key, const Array& lower, const Array& upper, std::optional<Shape> shape,
                       DType dtype) {
  check_key("truncated_normal", key);
  check_float("truncated_normal", dtype);
  if (!lower.defined() || !upper.defined())
    throw ValueError("random.truncated_normal: lower/upper is an empty Array handle");
  Shape s;
  if (shape) {
    check_shape("truncated_normal", *shape);
    s = *shape;
  } else {
    s = jnp::broadcast_shapes({lower.shape(), upper.shape()});
  }
  Array sqrt2 = make_scalar(std::sqrt(2.0), dtype);
  Array lo = bcast_param("truncated_normal", "lower", lower, dtype, s);
  Array hi = bcast_param("truncated_normal", "upper", upper, dtype, s);
  Array a = lax::erf(lax::div(lo, sqrt2));
  Array b = lax::erf(lax::div(hi, sqrt2));
  Array u = uniform_impl("truncated_normal", key, s, dtype, a, b);
  Array out = lax::mul(sqrt2, lax::erf_inv(u));
  Array lo_n = next_toward(lax::stop_gradient(lo), true), hi_n = next_toward(lax::stop_gradient(hi), false);
  if (lo_n.ndim() == 0 && out.ndim() != 0) lo_n = jnp::broadcast_to(lo_n, s);
  if (hi_n.ndim() == 0 && out.ndim() != 0) hi_n = jnp::broadcast_to(hi_n, s);
  return lax::min(lax::max(out, lo_n), hi_n);
}

Array bernoulli(const Array& key, const Array& p, std::optional<Shape> shape) {
  check_key("bernoulli", key);
  if (!p.defined()) throw ValueError("random.bernoulli: p is an empty Array handle");
  DType d = p.dtype();
  if (!is_floating(d))
    throw DTypeError(fmt::format("random.bernoulli: p must be a floating-point probability, got {}", dtype_name(d)));
  if (p.weak_type()) d = DType::float32;  // a C++ scalar takes JAX's default float dtype
  Shape s = shape ? *shape : p.shape();
  check_shape("bernoulli", s);
  Array pp = bcast_param("bernoulli", "p", p, d, s);
  Array u = uniform_impl("bernoulli", key, s, d, make_scalar(0.0, d), make_scalar(1.0, d));
  return lax::lt(u, pp);
}

Array randint(const Array& key, const Shape& shape, const Array& minval_in, const Array& maxval_in, DType dtype) {
  check_key("randint", key);
  check_shape("randint", shape);
  if (!is_integer(dtype))
    throw DTypeError(fmt::format("random.randint only accepts integer dtypes, got {}", dtype_name(dtype)));
  if (!minval_in.defined() || !maxval_in.defined())
    throw ValueError("random.randint: minval/maxval is an empty Array handle");
  Array minval = as_int_bound(minval_in), maxval = as_int_bound(maxval_in);
  const int nbits = int_bits(dtype);
  const UOps u{nbits, nbits == 8 ? DType::uint8 : nbits == 64 ? DType::int64 : DType::uint32};

  // maxval beyond dtype's max (e.g. randint(0, 256, uint8)): the span is one larger.
  Array maxval_out_of_range =
      lax::gt(maxval, convert_and_clip_integer(int_const(iinfo(dtype).hi, dtype), maxval.dtype()));
  maxval_out_of_range = bcast_param("randint", "maxval", maxval_out_of_range, DType::bool_, shape);
  Array lo = bcast_param("randint", "minval", convert_and_clip_integer(minval, dtype), dtype, shape);
  Array hi = bcast_param("randint", "maxval", convert_and_clip_integer(maxval, dtype), dtype, shape);

  Array keys = split_impl(key, {2});
  Array k1 = lax::reshape(lax::slice(keys, {0, 0}, {1, 2}), {2});
  Array k2 = lax::reshape(lax::slice(keys, {1, 0}, {2, 2}), {2});
  Array higher_bits = random_bits(k1, nbits, shape), lower_bits = random_bits(k2, nbits, shape);

  auto full = [&](const Array& v, const Array& like) { return like.ndim() == 0 ? v : jnp::full_like(like, v); };
  Array span = u.to_unsigned(lax::sub(hi, lo));
  Array hi_le_lo = lax::le(hi, lo);
  span = lax::select(hi_le_lo, full(u.c(1), span), span);
  Array grow = lax::bitwise_and(maxval_out_of_range, lax::bitwise_not(hi_le_lo));
  span = lax::select(grow, u.add(span, full(u.c(1), span)), span);
  if (span.ndim() == 0 && !shape.empty()) span = jnp::broadcast_to(span, shape);

  Array multiplier = u.rem(full(u.c(uint64_t(1) << (nbits / 2)), span), span);
  multiplier = u.rem(u.mul(multiplier, multiplier), span);
  Array offset = u.add(u.mul(u.rem(higher_bits, span), multiplier), u.rem(lower_bits, span));
  offset = u.rem(offset, span);
  return lax::add(lo, lax::convert_element_type(offset, dtype));
}

Array gumbel(const Array& key, const Shape& shape, DType dtype) {
  check_key("gumbel", key);
  check_shape("gumbel", shape);
  check_float("gumbel", dtype);
  double tiny = 0;
  switch (dtype) {
    case DType::float16: tiny = std::ldexp(1.0, -14); break;
    case DType::bfloat16:
    case DType::float32: tiny = double(std::numeric_limits<float>::min()); break;
    default: tiny = std::numeric_limits<double>::min();
  }
  Array u = uniform_impl("gumbel", key, shape, dtype, make_scalar(tiny, dtype), make_scalar(1.0, dtype));
  return lax::neg(lax::log(lax::neg(lax::log(u))));
}

Array categorical(const Array& key, const Array& logits, int64_t axis, std::optional<Shape> shape) {
  check_key("categorical", key);
  if (!logits.defined()) throw ValueError("random.categorical: logits is an empty Array handle");
  if (!is_floating(logits.dtype()))
    throw DTypeError(
        fmt::format("random.categorical: logits must be floating-point, got {}", dtype_name(logits.dtype())));
  if (logits.ndim() == 0)
    throw ShapeError("random.categorical: logits must have at least one dimension (the category axis), got a scalar");
  int64_t nd = logits.ndim();
  int64_t ax = canonicalize_axis(axis, nd, "random.categorical");
  Shape batch_shape;
  for (int64_t i = 0; i < nd; ++i)
    if (i != ax) batch_shape.push_back(logits.shape()[size_t(i)]);
  Shape s = shape ? *shape : batch_shape;
  check_shape("categorical", s);
  bool ok = s.size() >= batch_shape.size() &&
            std::equal(batch_shape.begin(), batch_shape.end(), s.end() - int64_t(batch_shape.size()));
  if (!ok)
    throw ShapeError(
        fmt::format("random.categorical: shape {} must end with the logits' batch shape {} (logits "
                    "shape {} without axis {})",
                    shape_str(s), shape_str(batch_shape), shape_str(logits.shape()), axis));
  size_t prefix = s.size() - batch_shape.size();
  Shape full_shape(s.begin(), s.begin() + int64_t(prefix));
  Shape lshape(s.begin() + int64_t(prefix), s.end());
  lshape.insert(lshape.begin() + ax, logits.shape()[size_t(ax)]);
  full_shape.insert(full_shape.end(), lshape.begin(), lshape.end());
  Array g = gumbel(key, full_shape, logits.dtype());
  Array l = prefix ? jnp::broadcast_to(logits, full_shape) : logits;
  return lax::argmax(lax::add(g, l), int64_t(prefix) + ax, DType::int32);
}

Array permutation(const Array& key, int64_t n) {
  check_key("permutation", key);
  if (n < 0) throw ValueError(fmt::format("random.permutation: n must be non-negative, got {}", n));
  return shuffle(key, lax::iota(DType::int32, n), 0);
}

Array permutation(const Array& key, const Array& x, int64_t axis, bool independent) {
  check_key("permutation", key);
  if (!x.defined()) throw ValueError("random.permutation: x is an empty Array handle");
  if (x.ndim() == 0) {
    if (!is_integer(x.dtype()))
      throw DTypeError(
          fmt::format("random.permutation: x must be an integer or at least 1-dimensional, got a {} "
                      "scalar",
                      dtype_name(x.dtype())));
    require_concrete(x, "random.permutation(x) with a scalar x (the permutation length must be static)");
    return permutation(key, x.item<int64_t>());
  }
  int64_t ax = canonicalize_axis(axis, x.ndim(), "random.permutation");
  if (independent || x.ndim() == 1) return shuffle(key, x, ax);
  Array ind = shuffle(key, lax::iota(DType::int32, x.shape()[size_t(ax)]), 0);
  return jnp::take(x, ind, ax);
}

}  // namespace random
}  // namespace cjax
