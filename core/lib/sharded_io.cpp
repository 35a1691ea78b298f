// Sharded checkpoints (cjax/io.h: save_sharded, load_sharded): a directory that every process of
// a run writes its own blocks to, and that any number of processes read onto any sharding.
//
//   DIR/process<k>.<n>.safetensors  the blocks process k's devices hold, each distinct block once,
//                                   as tensors "<leaf>@<block>"; n counts the saves into DIR
//   DIR/index.json                  written last, by process 0, atomically: for every leaf its
//                                   shape, dtype and blocks (file, tensor, start, stop), plus the
//                                   metadata and n
//
// Which process writes a block is decided from the sharding alone (the first device in the
// sharding's device order that holds it), so process 0 writes the index without hearing from the
// others. Two barriers through the coordinator's store bracket the index: every file is written
// before the index names it, and no process starts the next save (reading n) before the index is
// in place. Files of earlier saves are removed only after the new index is; a save that dies
// midway leaves the previous checkpoint whole.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>

#include "cjax/collectives.h"
#include "cjax/distributed.h"
#include "cjax/errors.h"
#include "cjax/io.h"
#include "cjax/lax.h"
#include "cjax/numpy.h"
#include "cjax/sharding.h"
#include "core/array/array_impl.h"
#include "core/distributed/kv_store.h"
#include "core/distributed/runtime.h"
#include "core/lib/io_internal.h"

namespace cjax::io {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr const char* kIndex = "index.json";
constexpr const char* kFormat = "cjax-sharded-checkpoint";

// A block of the global array: [start, stop) per dimension.
struct Block {
  std::vector<int64_t> start, stop;
  bool operator==(const Block&) const = default;
  bool operator<(const Block& o) const { return std::tie(start, stop) < std::tie(o.start, o.stop); }
};

Block block_of(const std::vector<Slice>& index, const Shape& shape) {
  Block b;
  for (size_t d = 0; d < shape.size(); ++d) {
    bool given = d < index.size();
    b.start.push_back(given && index[d].start ? *index[d].start : 0);
    b.stop.push_back(given && index[d].stop ? *index[d].stop : shape[d]);
  }
  return b;
}

// Every device holding a piece of `a`, with the block it holds, in the sharding's device order.
std::vector<std::pair<Device, Block>> placement(const Array& a) {
  const Sharding& s = a.sharding();
  if (const auto* named = dynamic_cast<const NamedSharding*>(&s)) {
    std::vector<std::vector<Slice>> indices = named->devices_indices(a.shape());
    std::vector<std::pair<Device, Block>> out;
    for (size_t k = 0; k < indices.size(); ++k)
      out.emplace_back(named->mesh().devices()[k], block_of(indices[k], a.shape()));
    return out;
  }
  return {{s.device_set().at(0), block_of({}, a.shape())}};
}

std::string file_name(int process, int64_t sequence) {
  return fmt::format("process{}.{}.safetensors", process, sequence);
}

// (process, save number) of a file named as file_name() names them; nullopt for any other name.
std::optional<std::pair<int64_t, int64_t>> parse_file_name(const std::string& leaf) {
  auto number = [](std::string_view digits) -> std::optional<int64_t> {
    if (digits.empty() || digits.size() > 15 ||
        !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
      return std::nullopt;
    return std::stoll(std::string(digits));
  };
  std::string_view v = leaf, prefix = "process", suffix = ".safetensors";
  if (v.size() <= prefix.size() + suffix.size() || !v.starts_with(prefix) || !v.ends_with(suffix)) return std::nullopt;
  v = v.substr(prefix.size(), v.size() - prefix.size() - suffix.size());
  size_t dot = v.find('.');
  if (dot == std::string_view::npos) return std::nullopt;
  std::optional<int64_t> process = number(v.substr(0, dot)), save = number(v.substr(dot + 1));
  if (!process || !save) return std::nullopt;
  return std::pair{*process, *save};
}

std::optional<json> read_index(std::string_view fn, const fs::path& dir) {
  fs::path p = dir / kIndex;
  if (!fs::exists(p)) return std::nullopt;
  std::ifstream in(p);
  std::stringstream text;
  text << in.rdbuf();
  json j;
  try {
    j = json::parse(text.str());
  } catch (const json::exception& e) {
    fail(fn, dir, fmt::format("index.json is not valid JSON ({})", e.what()));
  }
  if (!j.is_object() || j.value("format", "") != kFormat || !j.contains("arrays") || !j["arrays"].is_array())
    fail(fn, dir, "index.json is not a cjax sharded checkpoint index");
  return j;
}

json require_index(std::string_view fn, const fs::path& dir) {
  std::optional<json> j = read_index(fn, dir);
  if (!j) fail(fn, dir, "no index.json: not a sharded checkpoint (io::save_sharded), or its first save did not finish");
  return *j;
}

std::chrono::milliseconds collective_timeout() {
  return std::chrono::milliseconds(int64_t(config::collective_timeout_seconds() * 1000));
}

// Processes meet at `phase` of save number `save` (nothing to do on one process).
void barrier(const std::string& phase, int64_t save) {
  if (distributed::KvStoreClient* store = distributed::store())
    store->barrier(fmt::format("ckpt{}/{}/{}", distributed::generation(), save, phase), collective_timeout());
}

// Saves are numbered from 0 in every distributed run (every process saves in the same order).
int64_t next_save_number() {
  static std::mutex mu;
  static int generation = -1;
  static int64_t next = 0;
  std::lock_guard lk(mu);
  if (generation != distributed::generation()) {
    generation = distributed::generation();
    next = 0;
  }
  return next++;
}

}  // namespace

void save_sharded_entries(const fs::path& dir, const std::vector<std::pair<std::string, Array>>& entries,
                          const Metadata& metadata) {
  constexpr std::string_view fn = "io::save_sharded";
  int64_t save = next_save_number();
  std::map<std::string, const Array*> by_name;
  for (const auto& [name, a] : entries) {
    if (name.empty() || name.find('@') != std::string::npos)
      throw ValueError(fmt::format("{}: leaf name '{}' must be non-empty and free of '@'", fn, name));
    if (!by_name.emplace(name, &a).second) throw ValueError(fmt::format("{}: two leaves are named '{}'", fn, name));
    if (!concrete(a))
      throw ConcretizationError(
          fmt::format("{}: leaf '{}' is a tracer ({}); save concrete arrays, outside jit", fn, name, a.aval().str()));
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail(fn, dir, fmt::format("cannot create the directory: {}", ec.message()));
  // Process 0 numbers the save and tells the others (a file system's caches could show another
  // process an older index, and a wrong number would overwrite files the live index names).
  int64_t sequence = 0;
  distributed::KvStoreClient* store = distributed::store();
  std::string sequence_key = fmt::format("ckpt{}/{}/sequence", distributed::generation(), save);
  if (process_index() == 0) {
    std::optional<json> previous = read_index(fn, dir);
    sequence = previous ? previous->value("sequence", int64_t(0)) + 1 : 0;
    if (store) {
      std::string text = std::to_string(sequence);
      store->set(sequence_key, std::vector<char>(text.begin(), text.end()));
    }
  } else {
    std::vector<char> v = store->get(sequence_key, collective_timeout());
    sequence = std::stoll(std::string(v.begin(), v.end()));
  }

  // This process's blocks, and (on process 0) the index.
  int me = process_index();
  std::vector<std::pair<std::string, Array>> mine;
  json arrays = json::array();
  for (const auto& [name, a] : entries) {
    std::vector<std::pair<Device, Block>> where = placement(a);
    std::map<Block, Device> writer;
    for (const auto& [d, b] : where) writer.emplace(b, d);  // the first holder of each block
    std::vector<Shard> local;
    if (std::any_of(where.begin(), where.end(), [&](const auto& w) { return process_index_of(w.first) == me; }))
      local = a.addressable_shards();
    auto data_on = [&](const Device& d) {
      for (const Shard& s : local)
        if (s.device == d) return s.data;
      throw Error(fmt::format("internal: io::save_sharded found no shard of '{}' on {}", name, d.str()));
    };
    json blocks = json::array();
    int64_t number = 0;
    for (const auto& [d, b] : where) {
      if (writer.at(b) != d) continue;  // a copy of a block written by an earlier device
      std::string tensor = fmt::format("{}@{}", name, number++);
      int owner = process_index_of(d);
      if (owner == me) mine.emplace_back(tensor, data_on(d));
      blocks.push_back(
          {{"file", file_name(owner, sequence)}, {"tensor", tensor}, {"start", b.start}, {"stop", b.stop}});
    }
    arrays.push_back(
        {{"name", name}, {"shape", a.shape()}, {"dtype", std::string(dtype_name(a.dtype()))}, {"blocks", blocks}});
  }
  save_safetensors_entries(dir / file_name(me, sequence), mine);
  barrier("written", save);
  if (me == 0) {
    json index = {{"format", kFormat},    {"version", 1},    {"sequence", sequence}, {"processes", process_count()},
                  {"metadata", metadata}, {"arrays", arrays}};
    write_file_atomically(fn, dir / kIndex, index.dump(1));
    // Files the index does not name (earlier saves; a save of this number by more processes that
    // died midway), only now that the index names the new ones. Best effort: the checkpoint is
    // complete whatever is left.
    std::vector<fs::path> stale;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      std::optional<std::pair<int64_t, int64_t>> named = parse_file_name(it->path().filename().string());
      if (named && (named->second != sequence || named->first >= process_count())) stale.push_back(it->path());
    }
    for (const fs::path& f : stale) fs::remove(f, ec);
  }
  barrier("indexed", save);
}

std::vector<std::pair<std::string, AbstractValue>> load_sharded_index(const fs::path& dir) {
  constexpr std::string_view fn = "io::load_sharded_index";
  json index = require_index(fn, dir);
  std::vector<std::pair<std::string, AbstractValue>> out;
  for (const json& a : index["arrays"]) {
    std::optional<DType> d = dtype_from_name(a.at("dtype").get<std::string>());
    if (!d) fail(fn, dir, fmt::format("leaf '{}' has an unknown dtype", a.at("name").get<std::string>()));
    out.emplace_back(a.at("name").get<std::string>(), AbstractValue{a.at("shape").get<Shape>(), *d, false, {}});
  }
  return out;
}

Metadata load_sharded_metadata(const fs::path& dir) {
  json index = require_index("io::load_sharded_metadata", dir);
  return index.value("metadata", json::object()).get<Metadata>();
}

Array load_sharded(const fs::path& dir, const std::string& name, const Sharding& sharding) {
  constexpr std::string_view fn = "io::load_sharded";
  json index = require_index(fn, dir);
  const json* entry = nullptr;
  std::vector<std::string> names;
  for (const json& a : index["arrays"]) {
    names.push_back(a.at("name").get<std::string>());
    if (names.back() == name) entry = &a;
  }
  if (!entry)
    fail(fn, dir,
         fmt::format("has no leaf '{}' (it has {})", name,
                     names.size() > 8 ? fmt::format("{} leaves", names.size())
                                      : fmt::format("{}", fmt::join(names, ", "))));
  Shape shape = entry->at("shape").get<Shape>();
  std::optional<DType> dtype = dtype_from_name(entry->at("dtype").get<std::string>());
  if (!dtype) fail(fn, dir, fmt::format("leaf '{}' has an unknown dtype", name));
  struct Stored {
    Block block;
    std::string file, tensor;
  };
  std::vector<Stored> stored;
  for (const json& b : entry->at("blocks")) {
    Stored s{{b.at("start").get<std::vector<int64_t>>(), b.at("stop").get<std::vector<int64_t>>()},
             b.at("file").get<std::string>(),
             b.at("tensor").get<std::string>()};
    bool valid = s.block.start.size() == shape.size() && s.block.stop.size() == shape.size() &&
                 s.file.find('/') == std::string::npos;
    for (size_t d = 0; valid && d < shape.size(); ++d)
      valid = 0 <= s.block.start[d] && s.block.start[d] <= s.block.stop[d] && s.block.stop[d] <= shape[d];
    if (!valid)
      fail(fn, dir, fmt::format("index.json: a block of '{}' does not fit its shape {}", name, shape_str(shape)));
    stored.push_back(std::move(s));
  }
  std::map<std::string, Array> read;  // stored blocks read so far, by tensor
  std::map<Block, Array> assembled;   // blocks made so far (replicas ask for the same one)
  auto make_block = [&](const std::vector<Slice>& index) -> Array {
    Block want = block_of(index, shape);
    if (auto it = assembled.find(want); it != assembled.end()) return it->second;
    Shape extent;
    for (size_t d = 0; d < shape.size(); ++d) extent.push_back(want.stop[d] - want.start[d]);
    Array out = numpy::zeros(extent, *dtype);
    int64_t covered = 0;
    for (const Stored& s : stored) {
      std::vector<int64_t> lo, hi, piece_lo, piece_hi, at;
      bool overlaps = true;
      for (size_t d = 0; d < shape.size(); ++d) {
        lo.push_back(std::max(want.start[d], s.block.start[d]));
        hi.push_back(std::min(want.stop[d], s.block.stop[d]));
        overlaps = overlaps && lo[d] < hi[d];
        piece_lo.push_back(lo[d] - s.block.start[d]);
        piece_hi.push_back(hi[d] - s.block.start[d]);
        at.push_back(lo[d] - want.start[d]);
      }
      if (!overlaps && !shape.empty()) continue;
      auto it = read.find(s.tensor);
      if (it == read.end()) {
        Array t = load_safetensors_tensor(dir / s.file, s.tensor);
        Shape stored_extent;
        for (size_t d = 0; d < shape.size(); ++d) stored_extent.push_back(s.block.stop[d] - s.block.start[d]);
        if (t.shape() != stored_extent || t.dtype() != *dtype)
          fail(fn, dir,
               fmt::format("tensor '{}' of {} is {}, but the index says {}", s.tensor, s.file, t.aval().str(),
                           AbstractValue{stored_extent, *dtype, false, {}}.str()));
        it = read.emplace(s.tensor, t).first;
      }
      Array piece = shape.empty() ? it->second : lax::slice(it->second, piece_lo, piece_hi);
      std::vector<Array> starts;
      for (int64_t v : at) starts.push_back(Array(v));
      out = shape.empty() ? piece : lax::dynamic_update_slice(out, piece, starts);
      int64_t n = 1;
      for (size_t d = 0; d < shape.size(); ++d) n *= hi[d] - lo[d];
      covered += n;
    }
    if (covered != shape_size(extent))
      fail(fn, dir,
           fmt::format("the stored blocks of '{}' cover {} of the {} elements of a block", name, covered,
                       shape_size(extent)));
    assembled.emplace(want, out);
    return out;
  };
  if (const auto* named = dynamic_cast<const NamedSharding*>(&sharding))
    return make_array_from_callback(shape, *named, make_block);
  Device d = sharding.device_set().at(0);
  return device_put(make_block({}), SingleDeviceSharding(d));
}

}  // namespace cjax::io
