// cjax::random — JAX's threefry2x32 PRNG, bit-compatible with jax.random (docs/prng.md).
// Keys are raw uint32 arrays of shape [2] (JAX's "raw key" form, jax.random.PRNGKey). Every
// function is a composition of lax primitives (threefry2x32, iota, shifts, bitcasts, ...), so it
// runs eagerly, traces under jit and vmaps like any other op. Sampling functions take a single
// key of shape [2]; batch over keys with vmap, as in JAX.
#pragma once
#include <cstdint>
#include <optional>

#include "cjax/array.h"

namespace cjax {

namespace config {
// Chooses JAX's `jax_threefry_partitionable` scheme (default true, as in JAX >= 0.5): element i of
// a draw depends only on i, and split(key)[i] == fold_in(key, i). false gives the legacy values.
void set_threefry_partitionable(bool enabled);
bool threefry_partitionable();  // the scheme in force
}  // namespace config

namespace random {

// A key from a 64-bit seed: [hi32(seed), lo32(seed)] (JAX's x64 reading; 0 <= seed < 2^31 is [0, seed] in every mode).
Array key(uint64_t seed);
// A key from an integer scalar Array seed (traceable); 32-bit seeds give [0, u32(seed)] like JAX's default x32 mode.
Array key(const Array& seed);
// Alias of key(seed), as jax.random.PRNGKey.
inline Array PRNGKey(uint64_t seed) { return key(seed); }
// Alias of key(seed) for an Array seed.
inline Array PRNGKey(const Array& seed) { return key(seed); }
// The raw uint32 data of a key (identity on raw keys; validates shape [..., 2] and dtype uint32).
Array key_data(const Array& key);

// `num` new keys derived from `key`, shape [num, 2] (num >= 1).
Array split(const Array& key, int64_t num = 2);
// prod(shape) new keys derived from `key`, shape [*shape, 2].
Array split(const Array& key, const Shape& shape);
// A new key from `key` and the integer `data` (taken modulo 2^32, as jnp.uint32(data)).
Array fold_in(const Array& key, int64_t data);
// fold_in with an integer scalar Array as data (traceable).
Array fold_in(const Array& key, const Array& data);

// Uniform random bits; dtype u8 / u32, or i16 / i64 holding the 16- / 64-bit patterns (cjax has no u16/u64).
Array bits(const Array& key, const Shape& shape = {}, DType dtype = DType::uint32);
// Uniform floats in [minval, maxval) (f32, f64, bf16, f16); minval/maxval broadcast to `shape`.
Array uniform(const Array& key, const Shape& shape = {}, DType dtype = DType::float32, const Array& minval = 0.0,
              const Array& maxval = 1.0);
// Standard normal floats (sqrt(2) * erf_inv of a uniform draw in (-1, 1)).
Array normal(const Array& key, const Shape& shape = {}, DType dtype = DType::float32);
// Normal floats truncated to (lower, upper); shape defaults to the broadcast shape of lower and upper.
Array truncated_normal(const Array& key, const Array& lower, const Array& upper,
                       std::optional<Shape> shape = std::nullopt, DType dtype = DType::float32);
// Booleans that are true with probability p; shape defaults to p's shape.
Array bernoulli(const Array& key, const Array& p = 0.5, std::optional<Shape> shape = std::nullopt);
// Integers in [minval, maxval) with JAX's algorithm; maxval <= minval yields minval.
Array randint(const Array& key, const Shape& shape, const Array& minval, const Array& maxval,
              DType dtype = DType::int32);
// Standard Gumbel samples, -log(-log(uniform(tiny, 1))).
Array gumbel(const Array& key, const Shape& shape = {}, DType dtype = DType::float32);
// Samples category indices (int32) from unnormalized log-probabilities by the Gumbel-max trick;
// shape defaults to logits' shape without `axis`.
Array categorical(const Array& key, const Array& logits, int64_t axis = -1, std::optional<Shape> shape = std::nullopt);
// A random permutation of arange(n) (int32), JAX's rounds of sorting by random 32-bit keys.
Array permutation(const Array& key, int64_t n);
// x shuffled along `axis` (independent: each 1-D slice shuffled separately, else whole slices permuted).
Array permutation(const Array& key, const Array& x, int64_t axis = 0, bool independent = false);

}  // namespace random
}  // namespace cjax
