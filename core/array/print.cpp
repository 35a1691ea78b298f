// Array printing: numpy's `str(array)` text (operator<<, to_string), JAX's `repr(array)` text
// (repr) and the one-line-per-value debug string the gdb pretty-printer shows
// (cjax_debug_string).
//
// The layout is a port of numpy's arrayprint.py with its default options (linewidth 75,
// threshold 1000, edgeitems 3, precision 8, floatmode 'maxprec', legacy off): `format_array` is
// numpy's _formatArray, and each dtype class has one element formatter, built from the values that
// will be shown (numpy's _get_format_function):
//   BoolFormat      bool                      "True"/"False", padded to " True" in n-d arrays
//   IntFormat<T>    int8..int64, uint8/32     '%{w}d', w = widest of str(min), str(max)
//   FloatFormat<T>  float16, float32, float64 numpy's FloatingFormat: shortest unique digits of T
//                                             (at most 8 fractional digits), common padding,
//                                             scientific notation when values are >= 1e8,
//                                             < 1e-4 or span more than 1000x
//   ReprFormat      bfloat16                  numpy treats ml_dtypes' bfloat16 as a generic type
//                                             and prints each element with repr(), which is C++
//                                             `ostream << float` (6 significant digits, "%g"),
//                                             unpadded: JAX prints Array([1, 2.5], dtype=bfloat16)
// 0-d arrays print like numpy scalars (`str(np.float32(1))` is "1.0"), except inside repr, where
// numpy's array2string formats them like elements ("1.").
// Where numpy 1.x and 2.x differ (the scientific-notation threshold compares in the array's
// dtype under NEP 50), this follows numpy 2.
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "core/array/array_impl.h"
#include "core/array/visit_dtype.h"

namespace cjax {
namespace {

// numpy's default print options.
constexpr int kLineWidth = 75;
constexpr int64_t kThreshold = 1000;  // summarise arrays with more elements than this
constexpr int64_t kEdgeItems = 3;     // items shown at each end of a summarised axis
constexpr int kPrecision = 8;         // at most this many fractional digits

// ------------------------------------------------------------------------------------------------
// Decimal digits of floating-point values.

// |value| = d0.d1d2... x 10^exp, with `digits` = "d0d1d2..." (no trailing zeros except for 0).
struct Decimal {
  bool negative = false;
  std::string digits;
  int exp = 0;
};

// Parses "d.ddde+XX" / "de-XX" (the output of to_chars/printf scientific) into a Decimal.
Decimal parse_scientific(std::string_view s, bool negative) {
  Decimal d;
  d.negative = negative;
  size_t e = s.find('e');
  for (char c : s.substr(0, e))
    if (c != '.') d.digits += c;
  std::from_chars(s.data() + e + 1 + (s[e + 1] == '+'), s.data() + s.size(), d.exp);
  while (d.digits.size() > 1 && d.digits.back() == '0') d.digits.pop_back();
  return d;
}

// Correctly rounded double -> float16 bits: round to odd into float (24 bits, enough room for a
// second rounding to 11 bits), then round to nearest even.
uint16_t half_bits_from_double(double v) {
  float f = float(v);
  if (double(f) != v && std::isfinite(f)) {
    uint32_t b;
    std::memcpy(&b, &f, 4);
    if ((b & 1u) == 0) b += (std::fabs(double(f)) > std::fabs(v)) ? uint32_t(-1) : 1u;
    std::memcpy(&f, &b, 4);
  }
  return float16_t::from_float(f);
}

// The shortest digits that read back as exactly `v` in its own type (numpy's Dragon4 "unique"
// mode); the closest such digits when several have the same length.
Decimal shortest(double v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, std::fabs(v), std::chars_format::scientific);
  return parse_scientific(std::string_view(buf, size_t(r.ptr - buf)), std::signbit(v));
}
Decimal shortest(float v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, std::fabs(v), std::chars_format::scientific);
  return parse_scientific(std::string_view(buf, size_t(r.ptr - buf)), std::signbit(v));
}
Decimal shortest(float16_t h) {
  double v = std::fabs(double(float(h)));
  uint16_t target = h.bits & 0x7fffu;
  if (target == 0) return Decimal{std::signbit(float(h)), "0", 0};
  for (int p = 1; p <= 17; ++p) {
    // The correctly rounded p-digit decimal (ties to the even digit, like Dragon4) if it reads
    // back; otherwise a neighbour one unit in the last digit away (near a power of two the
    // rounding interval is lopsided and a neighbour may read back when the closest does not).
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*e", p - 1, v);
    double closest = std::strtod(buf, nullptr);
    double unit = std::pow(10.0, parse_scientific(buf, false).exp - (p - 1));
    for (double cand : {closest, closest - unit, closest + unit}) {
      if (cand <= 0 || half_bits_from_double(cand) != target) continue;
      std::snprintf(buf, sizeof buf, "%.*e", p - 1, cand);
      return parse_scientific(buf, std::signbit(float(h)));
    }
  }
  return shortest(double(float(h)));  // not reached: 5 digits always identify a float16
}

template <class T>
double to_double(T v) {
  if constexpr (is_half_v<T>)
    return double(float(v));
  else
    return double(v);
}

// Positional text split at the point: {"-12", "5"} for -12.5. At most `max_frac` fractional digits
// (-1: no limit); the value is rounded there when its shortest digits are longer.
// `exact_integer_digits`: numpy's Dragon4 with min_digits=0 (what arrays use) generates every
// digit down to the ones place, so an integral float16 65504 prints "65504." although its
// shortest digits are "655e2" (the scalar prints "65500.0").
struct Parts {
  std::string int_part, frac;
};
template <class T>
Parts positional(T v, int max_frac, bool exact_integer_digits) {
  Decimal d = shortest(v);
  int nd = int(d.digits.size());
  int frac_len = std::max(0, nd - 1 - d.exp);
  Parts p;
  if ((max_frac >= 0 && frac_len > max_frac) || (exact_integer_digits && frac_len == 0)) {
    // Digits of the exact binary value, correctly rounded (what Dragon4 does at a cutoff).
    char buf[400];
    std::snprintf(buf, sizeof buf, "%.*f", frac_len == 0 ? 0 : max_frac, std::fabs(to_double(v)));
    std::string_view s(buf);
    size_t dot = s.find('.');
    p.int_part = std::string(s.substr(0, dot));
    p.frac = dot == std::string_view::npos ? "" : std::string(s.substr(dot + 1));
    while (!p.frac.empty() && p.frac.back() == '0') p.frac.pop_back();
  } else if (d.exp >= 0) {
    p.int_part = d.digits.substr(0, size_t(std::min(nd, d.exp + 1)));
    p.int_part.append(size_t(std::max(0, d.exp + 1 - nd)), '0');
    if (nd > d.exp + 1) p.frac = d.digits.substr(size_t(d.exp + 1));
  } else {
    p.int_part = "0";
    p.frac = std::string(size_t(-d.exp - 1), '0') + d.digits;
  }
  if (d.digits == "0") p.frac.clear();
  if (d.negative) p.int_part.insert(0, "-");
  return p;
}

// Scientific text split: {"-1", "25", -3} for -1.25e-03. At most `max_frac` mantissa fractional
// digits (-1: no limit).
struct SciParts {
  std::string int_part, frac;
  int exp = 0;
};
// `fixed_frac` >= 0: exactly that many mantissa digits of the exact value, correctly rounded
// (numpy's unique mode with min_digits: the digits past the shortest ones are real digits,
// float16 3.140625 with 3 digits is "3.141e+00", not "3.140e+00").
template <class T>
SciParts scientific(T v, int max_frac, int fixed_frac = -1) {
  Decimal d = shortest(v);
  if (fixed_frac >= 0 || (max_frac >= 0 && int(d.digits.size()) - 1 > max_frac)) {
    int digits = fixed_frac >= 0 ? fixed_frac : max_frac;
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*e", digits, std::fabs(to_double(v)));
    d = parse_scientific(buf, d.negative);
    if (fixed_frac >= 0)
      d.digits.append(size_t(fixed_frac + 1) - std::min(size_t(fixed_frac + 1), d.digits.size()), '0');
  }
  SciParts p;
  p.int_part = (d.negative ? "-" : "") + d.digits.substr(0, 1);
  p.frac = d.digits.substr(1);
  p.exp = d.exp;
  return p;
}

std::string exponent_text(int exp, int min_digits) {
  std::string digits = std::to_string(std::abs(exp));
  if (int(digits.size()) < min_digits) digits.insert(0, size_t(min_digits) - digits.size(), '0');
  return (exp < 0 ? "e-" : "e+") + digits;
}

std::string pad_left(std::string s, size_t width) {
  if (s.size() < width) s.insert(0, width - s.size(), ' ');
  return s;
}

// ------------------------------------------------------------------------------------------------
// Element formatters (numpy's BoolFormat, IntegerFormat, FloatingFormat, repr_format). Each is
// built from the values that will be shown, then called once per shown element.

class BoolFormat {
 public:
  BoolFormat(const std::vector<bool>&, bool is_0d) : true_str_(is_0d ? "True" : " True") {}
  std::string operator()(bool x) const { return x ? true_str_ : "False"; }

 private:
  std::string true_str_;
};

template <class T>
class IntFormat {
 public:
  IntFormat(const std::vector<T>& shown, bool) {
    if (shown.empty()) return;
    auto [lo, hi] = std::minmax_element(shown.begin(), shown.end());
    width_ = std::max(text(*lo).size(), text(*hi).size());
  }
  std::string operator()(T x) const { return pad_left(text(x), width_); }

 private:
  static std::string text(T x) {
    if constexpr (std::is_signed_v<T>)
      return std::to_string(int64_t(x));
    else
      return std::to_string(uint64_t(x));
  }
  size_t width_ = 0;
};

template <class T>
class FloatFormat {
 public:
  FloatFormat(const std::vector<T>& shown, bool) {
    std::vector<T> finite;
    bool has_neg_inf = false;
    for (T x : shown) {
      double d = to_double(x);
      if (std::isfinite(d))
        finite.push_back(x);
      else if (std::isinf(d) && d < 0)
        has_neg_inf = true;
    }
    // Scientific notation is chosen from the nonzero finite magnitudes, compared in T (NEP 50).
    bool any_nonzero = false;
    T max_v{}, min_v{};
    for (T x : finite) {
      T a = abs_t(x);
      if (to_double(a) == 0) continue;
      if (!any_nonzero || to_double(a) > to_double(max_v)) max_v = a;
      if (!any_nonzero || to_double(a) < to_double(min_v)) min_v = a;
      any_nonzero = true;
    }
    if (any_nonzero) {
      double ratio = to_double(T(to_double(max_v) / to_double(min_v)));  // rounded to T, like numpy
      exp_format_ = to_double(max_v) >= to_double(T(1e8)) || to_double(min_v) < to_double(T(1e-4)) || ratio > 1000.0;
    }
    if (finite.empty()) {
      pad_left_ = pad_right_ = 0;
    } else if (exp_format_) {
      for (T x : finite) {
        SciParts s = scientific(x, kPrecision);
        pad_left_ = std::max(pad_left_, int(s.int_part.size()));
        precision_ = std::max(precision_, int(s.frac.size()));
        exp_size_ = std::max(exp_size_, int(exponent_text(s.exp, 2).size()) - 2);
      }
      pad_right_ = exp_size_ + 2 + precision_;
    } else {
      for (T x : finite) {
        Parts p = positional(x, kPrecision, false);
        pad_left_ = std::max(pad_left_, int(p.int_part.size()));
        pad_right_ = std::max(pad_right_, int(p.frac.size()));
      }
    }
    // Room for "nan", "inf", "-inf" right-aligned in the common width.
    if (finite.size() != shown.size()) {
      int offset = pad_right_ + 1;
      pad_left_ = std::max({pad_left_, 3 - offset, 3 + int(has_neg_inf) - offset});
    }
  }

  std::string operator()(T x) const {
    double d = to_double(x);
    if (!std::isfinite(d)) {
      const char* s = std::isnan(d) ? "nan" : d < 0 ? "-inf" : "inf";
      return pad_left(s, size_t(pad_left_ + pad_right_ + 1));
    }
    if (exp_format_) {
      SciParts s = scientific(x, kPrecision, precision_);
      return pad_left(s.int_part, size_t(pad_left_)) + "." + s.frac + exponent_text(s.exp, exp_size_);
    }
    Parts p = positional(x, kPrecision, true);
    p.frac.append(size_t(pad_right_) - std::min(size_t(pad_right_), p.frac.size()), ' ');
    return pad_left(p.int_part, size_t(pad_left_)) + "." + p.frac;
  }

 private:
  static T abs_t(T x) {
    if constexpr (is_half_v<T>)
      return T(std::fabs(float(x)));
    else
      return std::fabs(x);
  }
  bool exp_format_ = false;
  int pad_left_ = 0, pad_right_ = 0;
  int precision_ = 0;  // scientific: common number of mantissa fractional digits
  int exp_size_ = 0;   // scientific: common number of exponent digits
};

// repr() of an ml_dtypes scalar: `ostream << float` ("%g"), NaN printed without its sign.
std::string ostream_float(float f) {
  if (std::isnan(f)) return "nan";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", double(f));
  return buf;
}

class ReprFormat {
 public:
  ReprFormat(const std::vector<bfloat16_t>&, bool) {}
  std::string operator()(bfloat16_t x) const { return ostream_float(float(x)); }
};

template <class T>
struct FormatterFor;
template <>
struct FormatterFor<bool> {
  using type = BoolFormat;
};
template <>
struct FormatterFor<bfloat16_t> {
  using type = ReprFormat;
};
template <>
struct FormatterFor<float16_t> {
  using type = FloatFormat<float16_t>;
};
template <>
struct FormatterFor<float> {
  using type = FloatFormat<float>;
};
template <>
struct FormatterFor<double> {
  using type = FloatFormat<double>;
};
template <class T>
requires std::is_integral_v<T> &&(!std::is_same_v<T, bool>)struct FormatterFor<T> {
  using type = IntFormat<T>;
};

// ------------------------------------------------------------------------------------------------
// Scalars: numpy's str() of a 0-d array is str() of its scalar, Python's float text.

template <class T>
std::string scalar_str(T v) {
  if constexpr (std::is_same_v<T, bool>) {
    return v ? "True" : "False";
  } else if constexpr (std::is_integral_v<T>) {
    return IntFormat<T>({}, true)(v);
  } else if constexpr (std::is_same_v<T, bfloat16_t>) {
    return ostream_float(float(v));
  } else {
    double d = to_double(v);
    if (std::isnan(d)) return "nan";
    if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
    double a = std::fabs(d);
    if (a == 0 || (a >= 1e-4 && a < 1e16)) {
      Parts p = positional(v, -1, false);
      return p.int_part + "." + (p.frac.empty() ? "0" : p.frac);
    }
    SciParts s = scientific(v, -1);
    return s.int_part + (s.frac.empty() ? "" : "." + s.frac) + exponent_text(s.exp, 2);
  }
}

// ------------------------------------------------------------------------------------------------
// Layout: numpy's _formatArray.

// The elements numpy shows: all, or the first and last kEdgeItems along every longer axis.
struct View {
  const Shape& shape;
  std::vector<int64_t> strides;
  bool summarise;
  bool summarised(size_t axis) const { return summarise && shape[axis] > 2 * kEdgeItems; }
};

template <class F>
void for_each_shown(const View& v, size_t axis, int64_t offset, F&& f) {
  if (axis == v.shape.size()) return f(offset);
  int64_t n = v.shape[axis];
  for (int64_t i = 0; i < n; ++i) {
    if (v.summarised(axis) && i == kEdgeItems) i = n - kEdgeItems;
    for_each_shown(v, axis + 1, offset + i * v.strides[axis], f);
  }
}

// numpy's _extendLine: append `word`, first wrapping onto a new line if it would pass `width`
// (unless the line holds nothing but its indent).
void extend_line(std::string& s, std::string& line, const std::string& word, size_t width,
                 const std::string& next_line_prefix) {
  if (line.size() + word.size() > width && line.size() > next_line_prefix.size()) {
    size_t end = line.find_last_not_of(' ');
    s.append(line, 0, end == std::string::npos ? 0 : end + 1);
    s += '\n';
    line = next_line_prefix;
  }
  line += word;
}

template <class T, class Fmt>
class Layout {
 public:
  Layout(const T* data, const View& view, const Fmt& fmt, std::string separator)
      : data_(data), view_(view), fmt_(fmt), sep_(std::move(separator)) {
    size_t end = sep_.find_last_not_of(' ');
    sep_stripped_ = sep_.substr(0, end == std::string::npos ? 0 : end + 1);
  }

  std::string recurse(size_t axis, int64_t offset, const std::string& hanging_indent, int width) const {
    size_t ndim = view_.shape.size();
    if (axis == ndim) return fmt_(data_[offset]);
    std::string next_indent = hanging_indent + " ";
    int next_width = width - 1;  // room for the closing ']'
    int64_t n = view_.shape[axis], stride = view_.strides[axis];
    bool summary = view_.summarised(axis);
    int64_t leading = summary ? kEdgeItems : 0, trailing = summary ? kEdgeItems : n;
    auto child = [&](int64_t i) { return recurse(axis + 1, offset + i * stride, next_indent, next_width); };

    std::string s;
    if (axis + 1 == ndim) {  // the last axis: words on lines, wrapped at the width
      size_t elem_width = size_t(width - std::max<int>(int(sep_stripped_.size()), 1));
      std::string line = hanging_indent;
      for (int64_t i = 0; i < leading; ++i) {
        extend_line(s, line, child(i), elem_width, hanging_indent);
        line += sep_;
      }
      if (summary) {
        extend_line(s, line, "...", elem_width, hanging_indent);
        line += sep_;
      }
      for (int64_t i = trailing; i > 1; --i) {
        extend_line(s, line, child(n - i), elem_width, hanging_indent);
        line += sep_;
      }
      extend_line(s, line, child(n - 1), elem_width, hanging_indent);
      s += line;
    } else {  // outer axes: one sub-array per line, blank lines between blocks
      std::string line_sep = sep_stripped_ + std::string(ndim - axis - 1, '\n');
      for (int64_t i = 0; i < leading; ++i) s += hanging_indent + child(i) + line_sep;
      if (summary) s += hanging_indent + "..." + line_sep;
      for (int64_t i = trailing; i > 1; --i) s += hanging_indent + child(n - i) + line_sep;
      s += hanging_indent + child(n - 1);
    }
    return "[" + s.substr(hanging_indent.size()) + "]";
  }

 private:
  const T* data_;
  const View& view_;
  const Fmt& fmt_;
  std::string sep_, sep_stripped_;
};

// Runs f(const T* data) on host-readable elements of a concrete array.
template <class T, class F>
decltype(auto) with_host_data(const Array& x, F&& f) {
  ConcreteArray& c = require_concrete(x, "printing an array");
  x.block_until_ready();
  if (c.buffers.size() == 1 && c.device().platform() == Platform::cpu)
    return f(static_cast<const T*>(c.buffer()->data()));
  std::vector<T> host = x.to_vector<T>();  // std::vector<bool> has no data(): copy to an array
  auto copy = std::make_unique<T[]>(host.size());
  std::copy(host.begin(), host.end(), copy.get());
  return f(static_cast<const T*>(copy.get()));
}

// numpy's array2string(x, separator=..., prefix=..., suffix=...) with the default options, for
// a concrete array of size > 0.
std::string array2string(const Array& x, const std::string& separator, const std::string& prefix, int line_width) {
  return visit_dtype(x.dtype(), [&](auto tag) -> std::string {
    using T = typename decltype(tag)::type;
    return with_host_data<T>(x, [&](const T* data) {
      View view{x.shape(), row_major_strides(x.shape()), x.size() > kThreshold};
      std::vector<T> shown;
      for_each_shown(view, 0, 0, [&](int64_t i) { shown.push_back(data[i]); });
      typename FormatterFor<T>::type fmt(shown, x.ndim() == 0);
      Layout<T, decltype(fmt)> layout(data, view, fmt, separator);
      return layout.recurse(0, 0, " " + std::string(prefix.size(), ' '), line_width);
    });
  });
}

std::string traced_str(const ArrayImpl& impl) {
  if (dynamic_cast<const ShapedArray*>(&impl))  // JAX's repr(jax.ShapeDtypeStruct)
    return fmt::format("ShapeDtypeStruct(shape={}, dtype={}{})", shape_str(impl.aval.shape),
                       dtype_name(impl.aval.dtype), impl.aval.weak_type ? ", weak_type=True" : "");
  if (auto* t = dynamic_cast<const Tracer*>(&impl)) {
    std::string v = t->value_str();
    if (!v.empty()) return v;
  }
  return fmt::format("Traced<{}[{}]>", dtype_name(impl.aval.dtype), fmt::join(impl.aval.shape, ","));
}

}  // namespace

// numpy's str(array).
std::string to_string(const Array& x) {
  const ArrayImpl* impl = x.impl();
  if (!impl) return "Array(empty)";
  if (!impl->is_concrete()) return traced_str(*impl);
  if (x.ndim() == 0)
    return visit_dtype(x.dtype(), [&](auto tag) -> std::string {
      using T = typename decltype(tag)::type;
      return with_host_data<T>(x, [](const T* data) { return scalar_str(data[0]); });
    });
  if (x.size() == 0) return "[]";
  return array2string(x, " ", "", kLineWidth);
}

std::ostream& operator<<(std::ostream& os, const Array& x) { return os << to_string(x); }

// JAX's repr(jax.Array) (jax/_src/array.py, ArrayImpl.__repr__), spacing quirks included.
std::string repr(const Array& x) {
  const ArrayImpl* impl = x.impl();
  if (!impl) return "Array(empty)";
  if (!impl->is_concrete()) return traced_str(*impl);
  const std::string prefix = "Array(";
  std::string dtype_str = fmt::format("dtype={}{})", dtype_name(x.dtype()), x.weak_type() ? ", weak_type=True" : "");
  std::string s = x.size() == 0 ? "[], shape=" + shape_str(x.shape())
                                : array2string(x, ", ", prefix, kLineWidth - 1 /* the suffix "," */);
  size_t nl = s.rfind('\n');
  int64_t last_line_len = int64_t(s.size()) - (nl == std::string::npos ? -1 : int64_t(nl)) + 1;
  std::string sep = last_line_len + int64_t(dtype_str.size()) + 1 > kLineWidth ? std::string(prefix.size(), ' ') : " ";
  return prefix + s + "," + sep + dtype_str;
}

// "f32[2,3] [[1. 2. 3.]\n [4. 5. 6.]]": the type and numpy text; never throws (used from gdb).
std::string debug_string(const Array& x) {
  try {
    const ArrayImpl* impl = x.impl();
    if (!impl) return "Array(empty)";
    if (!impl->is_concrete()) return impl->aval.str() + " <traced>";
    return impl->aval.str() + " " + to_string(x);
  } catch (const std::exception& e) {
    return fmt::format("<cjax: cannot print array: {}>", e.what());
  } catch (...) {
    return "<cjax: cannot print array>";
  }
}

}  // namespace cjax

// For debuggers: `array` points to a cjax::Array. The text lives in a thread-local buffer that the
// next call on the same thread overwrites.
extern "C" __attribute__((visibility("default"), used)) const char* cjax_debug_string(const void* array) {
  thread_local std::string buffer;
  if (!array) {
    buffer = "<null>";
    return buffer.c_str();
  }
  buffer = cjax::debug_string(*static_cast<const cjax::Array*>(array));
  return buffer.c_str();
}
