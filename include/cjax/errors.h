// cjax error types. Every misuse raises one of these; the message names the offending value,
// shape, dtype, axis or spec and says how to fix it.
#pragma once
#include <stdexcept>
#include <string>

namespace cjax {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct ShapeError : Error {
  using Error::Error;
};
struct DTypeError : Error {
  using Error::Error;
};
// An argument value outside its domain (negative count, unknown option string, index out of range).
struct ValueError : Error {
  using Error::Error;
};
struct ConcretizationError : Error {
  using Error::Error;
};
struct TracerBoolConversionError : ConcretizationError {
  using ConcretizationError::ConcretizationError;
};
struct EscapedTracerError : Error {
  using Error::Error;
};
struct ShardingError : Error {
  using Error::Error;
};
struct SpecError : Error {
  using Error::Error;
};
struct VmaError : Error {
  using Error::Error;
};
struct AxisNameError : Error {
  using Error::Error;
};
struct CollectiveError : Error {
  using Error::Error;
};
struct BackendError : Error {
  using Error::Error;
};
struct IoError : Error {
  using Error::Error;
};

}  // namespace cjax
