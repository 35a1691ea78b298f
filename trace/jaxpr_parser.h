// The inverse of the jaxpr printer (trace/jaxpr.h): reads JAX's jaxpr text back into the IR, so
// that printed jaxprs round-trip (text(parse(text(j))) == text(j)) and tests can write jaxprs by hand.
//
//   auto j = parse_jaxpr("{ lambda ; a:f32[3]. let b:f32[3] = mul a 2.0:f32[] in (b,) }");
//
// It reads everything the printer writes: constvars and invars with types (`f32[8,16]`, `bool[]`,
// `f32[2]{V:x,y}`), equations on one line (`; `-separated) or one per line, `_` for unused
// outputs, literals (`2.0:f32[]`, `-inf:f32[]`, `True:bool[]`, `3:i32[]`), params broken over
// lines, sub-jaxprs inline as param values (`jaxpr={ lambda ... }`) or hoisted before the jaxpr
// (`let name = { lambda ... } in`, referenced as `jaxpr=name`). Every jaxpr gets its own fresh
// variables (jaxprs are closed: a sub-jaxpr cannot use its enclosing jaxpr's variables).
//
// Types do not print weak types: variables are strong unless an equation's abstract evaluation
// says its output is weak (as a weak input propagates); literals are strong.
//
// Param values are read by their text (True/False, None, integers, floats, int tuples, tuples of
// int tuples, dtype names, sub-jaxprs, otherwise the text as a string); the structured params of
// dot_general, conv_general_dilated, gather and scatter* are rebuilt as the primitives build them.
//
// A malformed text raises ValueError naming the line and column and what was expected; an
// unknown primitive or an undefined variable is named.
#pragma once
#include <memory>
#include <string_view>
#include <vector>

#include "cjax/make_jaxpr.h"
#include "trace/jaxpr.h"

namespace cjax {

std::shared_ptr<const Jaxpr> parse_jaxpr(std::string_view text);

// The jaxpr with `consts`, one per constvar, each of its constvar's shape and dtype (ValueError
// otherwise).
ClosedJaxpr parse_closed_jaxpr(std::string_view text, std::vector<Array> consts);

}  // namespace cjax
