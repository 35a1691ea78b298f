// cjax::io — checkpoints and arrays on disk: safetensors (trees) and numpy .npy (single arrays).
//
// * save_safetensors(path, tree, metadata): every leaf is stored under its "."-joined key path
//   (`params["layers"][0]["mlp"]["w"]` -> "layers.0.mlp.w"; struct fields by name). Dtypes BOOL, I8, I16,
//   I32, I64, U8, U32, BF16, F16, F32, F64, little-endian; the JSON header is padded with spaces to a
//   multiple of 8 bytes; optional "__metadata__" string map. A tree with no leaves is allowed.
// * Checksums: save_safetensors stores an xxh3_64 (XXH3_64bits, seed 0; Python: xxhash.xxh3_64) of every
//   tensor's bytes in the metadata, under kChecksumKey as a JSON object {"name": "16 hex digits"}; loads
//   verify them and raise IoError "checksum mismatch in tensor 'name'" on a flipped bit. Files without
//   them (written by other tools) load unverified. load_safetensors_metadata does not return that key,
//   and passing it to save_safetensors is a ValueError.
// * load_safetensors(path) -> Dict nested by splitting the names on "."; segments that look like
//   non-negative integers without leading zeros ("0", "12") become int keys, so the Dict above round-trips.
// * save_npy / load_npy: format 1.0 written (2.0 when the header needs it), 1.0/2.0/3.0 read; descr
//   '|b1' '|i1' '<i2' '<i4' '<i8' '|u1' '<u4' '<f2' '<f4' '<f8' (big-endian '>' forms are read and
//   byte-swapped); fortran_order files are transposed into row-major arrays. bfloat16 has no npy dtype:
//   save_npy raises IoError (use safetensors, or astype(f32)).
// * Writes are atomic: the data goes to a temporary file ".<name>.cjax-tmp.<pid>.<n>" in the target's
//   directory, which is fsynced and renamed over the target; on any failure the temporary is removed and
//   the old target is untouched. A process killed mid-write leaves its temporary behind:
//   remove_stale_temporaries(target) deletes those of dead processes.
// * Reads validate everything before touching memory: any malformed file raises IoError naming the file
//   and the problem (missing, truncated, header length beyond the file, bad JSON, unknown dtype, offsets out
//   of range, overlapping or leaving gaps, shape/size mismatch, checksum mismatch). Paths that are not
//   regular files (directories, FIFOs, devices) are refused up front ("not a regular file"), without
//   waiting for a FIFO's writer.
// Arrays must be concrete (ConcretizationError for tracers) and held on one device (ShardingError for
// sharded arrays: gather first).
#pragma once
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cjax/array.h"
#include "cjax/tree.h"

namespace cjax::io {

using Metadata = std::map<std::string, std::string>;

// The metadata key of the per-tensor checksums written by save_safetensors (see above).
inline constexpr std::string_view kChecksumKey = "cjax.checksums.xxh3_64";

// Low-level form: explicit (name, array) entries; names must be unique and non-empty.
void save_safetensors_entries(const std::filesystem::path& path,
                              const std::vector<std::pair<std::string, Array>>& entries, const Metadata& metadata = {});

template <class T>
void save_safetensors(const std::filesystem::path& path, const T& tree, const Metadata& metadata = {}) {
  static_assert(is_tree_v<T>, "io::save_safetensors: the argument is not a tree of Arrays (see cjax/tree.h)");
  std::vector<std::pair<std::string, Array>> entries;
  for (auto& [p, a] : tree::leaves_with_path(tree)) entries.emplace_back(p.dotted(), std::move(a));
  save_safetensors_entries(path, entries, metadata);
}

// (name, array) entries in file-header (sorted name) order.
std::vector<std::pair<std::string, Array>> load_safetensors_entries(const std::filesystem::path& path);
Dict load_safetensors(const std::filesystem::path& path);
Metadata load_safetensors_metadata(const std::filesystem::path& path);

// One tensor of a safetensors file, reading only its bytes; IoError if the file has no `name`.
Array load_safetensors_tensor(const std::filesystem::path& path, std::string_view name);

// Sharded checkpoints: a directory that every process of a run writes its own blocks to, read onto
// any sharding by any number of processes (also arrays of one process: blocks of a NamedSharding,
// or one block).
// * save_sharded(dir, tree, metadata) is collective: every process calls it with the same tree
//   (same leaves, shapes and shardings). Process k writes DIR/process<k>.<n>.safetensors with the
//   blocks its devices hold, each distinct block once (of the devices holding copies of a block,
//   the first in the sharding's device order writes it, so replicated leaves are stored once);
//   then process 0 writes DIR/index.json (every leaf's shape, dtype and blocks: file, tensor,
//   start and stop per dimension; the metadata) atomically and removes the files of earlier saves.
//   n counts the saves into DIR: a save that dies midway leaves the previous checkpoint whole.
// * load_sharded(dir, name, sharding): leaf `name` laid out by `sharding` (a NamedSharding over any
//   mesh and process count, or one device); each process reads, for each block its devices hold,
//   only the stored blocks that overlap it.
// * load_sharded_index(dir): every leaf's name, shape and dtype; load_sharded_metadata(dir).
// IoError for a directory without index.json (not a sharded checkpoint, or its first save did not
// finish) and for a leaf it does not have.
void save_sharded_entries(const std::filesystem::path& dir, const std::vector<std::pair<std::string, Array>>& entries,
                          const Metadata& metadata = {});
template <class T>
void save_sharded(const std::filesystem::path& dir, const T& tree, const Metadata& metadata = {}) {
  static_assert(is_tree_v<T>, "io::save_sharded: the argument is not a tree of Arrays (see cjax/tree.h)");
  std::vector<std::pair<std::string, Array>> entries;
  for (auto& [p, a] : tree::leaves_with_path(tree)) entries.emplace_back(p.dotted(), std::move(a));
  save_sharded_entries(dir, entries, metadata);
}
std::vector<std::pair<std::string, AbstractValue>> load_sharded_index(const std::filesystem::path& dir);
Metadata load_sharded_metadata(const std::filesystem::path& dir);
Array load_sharded(const std::filesystem::path& dir, const std::string& name, const Sharding& sharding);

void save_npy(const std::filesystem::path& path, const Array& a);
Array load_npy(const std::filesystem::path& path);

// Deletes the temporaries of `target` (".<name>.cjax-tmp.<pid>.<n>" in its directory) left by writers
// that were killed mid-write: only files of exactly that pattern whose process no longer exists on this
// machine (a live process's may be a write in progress). Best effort, never throws; returns how many.
int remove_stale_temporaries(const std::filesystem::path& target);

}  // namespace cjax::io
