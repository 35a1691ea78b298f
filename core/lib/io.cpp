// cjax::io — safetensors and .npy readers/writers. Writes are atomic (temp file + fsync + rename);
// reads validate the whole layout before reading data, so a malformed file is an IoError, never a crash.
// safetensors files written here carry an xxh3_64 checksum per tensor in their metadata, verified on
// load (llvm::xxh3_64bits: the reference XXH3_64bits with seed 0, as Python's xxhash.xxh3_64).
#include "cjax/io.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <llvm/Support/xxhash.h>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <optional>

#include "core/array/array_impl.h"
#include "core/lib/io_internal.h"

static_assert(std::endian::native == std::endian::little, "cjax::io assumes a little-endian host");

namespace cjax::io {

namespace fs = std::filesystem;

[[noreturn]] void fail(std::string_view fn, const fs::path& p, std::string_view problem) {
  throw IoError(fmt::format("{}: '{}': {}", fn, p.string(), problem));
}

namespace {

const char* file_kind(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a plain file";
}

// ------------------------------------------------------------------------------------------------
// Reading: a file opened once, read with bounds-checked pread.

class InFile {
 public:
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever; it is
  // refused below like every other non-regular file (directories, devices, sockets).
  InFile(std::string_view fn, const fs::path& p) : fn_(fn), path_(p) {
    fd_ = ::open(p.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd_ < 0) fail(fn_, path_, fmt::format("cannot open for reading: {}", std::strerror(errno)));
    struct stat st {};
    if (::fstat(fd_, &st) != 0) {
      int e = errno;
      ::close(fd_);
      fail(fn_, path_, fmt::format("cannot stat: {}", std::strerror(e)));
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd_);
      fail(fn_, path_, fmt::format("not a regular file ({}); pass a file", file_kind(st.st_mode)));
    }
    ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) & ~O_NONBLOCK);
    size_ = uint64_t(st.st_size);
  }
  ~InFile() { ::close(fd_); }
  InFile(const InFile&) = delete;
  InFile& operator=(const InFile&) = delete;
  uint64_t size() const { return size_; }
  // Reads exactly n bytes at offset (the caller has validated offset + n <= size()).
  void read(uint64_t offset, void* dst, uint64_t n) const {
    if (offset > size_ || n > size_ - offset)
      fail(fn_, path_,
           fmt::format("truncated: needs bytes [{}, {}) but the file has {} bytes", offset, offset + n, size_));
    auto* d = static_cast<char*>(dst);
    while (n > 0) {
      ssize_t r = ::pread(fd_, d, size_t(std::min<uint64_t>(n, uint64_t(1) << 30)), off_t(offset));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) fail(fn_, path_, fmt::format("read error: {}", std::strerror(errno)));
      if (r == 0) fail(fn_, path_, fmt::format("truncated: the file ended at byte {} while reading", offset));
      d += r;
      offset += uint64_t(r);
      n -= uint64_t(r);
    }
  }

 private:
  std::string fn_;
  fs::path path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

// ------------------------------------------------------------------------------------------------
// Writing: temp file in the target's directory, fsync, rename, fsync the directory.

// The temporary of `target`: ".<name>.cjax-tmp.<pid>.<n>" beside it (see remove_stale_temporaries).
constexpr std::string_view kTmpTag = ".cjax-tmp.";
std::string tmp_prefix(const fs::path& target) { return "." + target.filename().string() + std::string(kTmpTag); }

class AtomicWriter {
 public:
  AtomicWriter(std::string_view fn, const fs::path& target) : fn_(fn), target_(target) {
    static std::atomic<uint64_t> counter{0};
    fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
    if (!target.has_filename()) fail(fn_, target_, "the path names a directory, not a file");
    tmp_ = dir / fmt::format("{}{}.{}", tmp_prefix(target), ::getpid(), counter.fetch_add(1));
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd_ < 0)
      fail(fn_, target_, fmt::format("cannot create a temporary file in '{}': {}", dir.string(), std::strerror(errno)));
  }
  ~AtomicWriter() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(tmp_.c_str());
  }
  AtomicWriter(const AtomicWriter&) = delete;
  AtomicWriter& operator=(const AtomicWriter&) = delete;

  void write(const void* data, uint64_t n) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      ssize_t w = ::write(fd_, p, size_t(std::min<uint64_t>(n, uint64_t(1) << 30)));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0)
        fail(fn_, target_,
             fmt::format("write failed after {} bytes: {}; the target was left unchanged", written_,
                         w < 0 ? std::strerror(errno) : "no progress"));
      p += w;
      n -= uint64_t(w);
      written_ += uint64_t(w);
    }
  }
  void commit() {
    if (::fsync(fd_) != 0)
      fail(fn_, target_, fmt::format("fsync failed: {}; the target was left unchanged", std::strerror(errno)));
    int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0)
      fail(fn_, target_, fmt::format("close failed: {}; the target was left unchanged", std::strerror(errno)));
    if (::rename(tmp_.c_str(), target_.c_str()) != 0)
      fail(fn_, target_, fmt::format("cannot rename the temporary file onto the target: {}", std::strerror(errno)));
    committed_ = true;
    fs::path dir = target_.has_parent_path() ? target_.parent_path() : fs::path(".");
    int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {  // make the rename durable (best effort: some filesystems refuse fsync on dirs)
      (void)::fsync(dfd);
      ::close(dfd);
    }
  }

 private:
  std::string fn_;
  fs::path target_, tmp_;
  int fd_ = -1;
  bool committed_ = false;
  uint64_t written_ = 0;
};

// A host-readable copy (or `a` itself) of a concrete single-device array: raw_ptr gives its bytes.
Array host_bytes(const Array& a, std::string_view fn, const fs::path& p, std::string_view name) {
  ConcreteArray& c = require_concrete(a, fmt::format("{} ('{}', array {})", fn, p.string(), name));
  a.block_until_ready();
  if (c.buffers.size() != 1)
    throw ShardingError(
        fmt::format("{}: '{}': array {} is sharded over {} devices; gather it to one device first "
                    "(device_put with a single-device sharding)",
                    fn, p.string(), name, c.buffers.size()));
  return to_host(a);
}

bool mul_overflows(uint64_t a, uint64_t b, uint64_t& out) { return __builtin_mul_overflow(a, b, &out); }

std::string shape_text(const Shape& s) { return shape_str(s); }

// ------------------------------------------------------------------------------------------------
// safetensors dtypes

struct StDType {
  const char* name;
  DType dtype;
};
constexpr StDType kStDTypes[] = {{"BOOL", DType::bool_},  {"I8", DType::int8},       {"I16", DType::int16},
                                 {"I32", DType::int32},   {"I64", DType::int64},     {"U8", DType::uint8},
                                 {"U32", DType::uint32},  {"BF16", DType::bfloat16}, {"F16", DType::float16},
                                 {"F32", DType::float32}, {"F64", DType::float64}};
const char* st_name(DType d) {
  for (const auto& e : kStDTypes)
    if (e.dtype == d) return e.name;
  return "?";
}
std::optional<DType> st_dtype(std::string_view s) {
  for (const auto& e : kStDTypes)
    if (s == e.name) return e.dtype;
  return std::nullopt;
}

void normalize_bools(Array& a) {
  auto* p = static_cast<unsigned char*>(raw_ptr(a));
  for (int64_t i = 0, n = a.size(); i < n; ++i) p[i] = p[i] != 0;
}

constexpr uint64_t kMaxHeader = uint64_t(100) << 20;  // as the reference implementation

uint64_t checksum(const void* data, uint64_t n) {
  return llvm::xxh3_64bits(llvm::ArrayRef<uint8_t>(static_cast<const uint8_t*>(data), size_t(n)));
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// safetensors

void save_safetensors_entries(const fs::path& path, const std::vector<std::pair<std::string, Array>>& entries,
                              const Metadata& metadata) {
  constexpr std::string_view fn = "io::save_safetensors";
  std::vector<size_t> order(entries.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return entries[a].first < entries[b].first; });
  for (size_t i = 0; i < order.size(); ++i) {
    const std::string& name = entries[order[i]].first;
    if (name.empty())
      throw ValueError(
          fmt::format("{}: '{}': an array has an empty name (a bare Array has no key path); put it in a "
                      "Dict or struct",
                      fn, path.string()));
    if (name == "__metadata__")
      throw ValueError(
          fmt::format("{}: '{}': '__metadata__' is reserved by the format; rename that entry", fn, path.string()));
    if (i > 0 && entries[order[i - 1]].first == name)
      throw ValueError(fmt::format("{}: '{}': two arrays are both named '{}'", fn, path.string(), name));
  }
  if (metadata.count(std::string(kChecksumKey)))
    throw ValueError(fmt::format("{}: '{}': metadata key '{}' is reserved for cjax's per-tensor checksums", fn,
                                 path.string(), kChecksumKey));
  // Validate and collect the data before creating any file.
  std::vector<const void*> data(entries.size());
  std::vector<Array> host(entries.size());
  nlohmann::json header = nlohmann::json::object();
  nlohmann::json sums = nlohmann::json::object();
  uint64_t offset = 0;
  for (size_t i : order) {
    const auto& [name, a] = entries[i];
    host[i] = host_bytes(a, fn, path, "'" + name + "'");
    data[i] = raw_ptr(host[i]);
    uint64_t nbytes = uint64_t(a.size()) * itemsize(a.dtype());
    header[name] = {{"dtype", st_name(a.dtype())}, {"shape", a.shape()}, {"data_offsets", {offset, offset + nbytes}}};
    sums[name] = fmt::format("{:016x}", checksum(data[i], nbytes));
    offset += nbytes;
  }
  if (!metadata.empty() || !entries.empty()) {
    nlohmann::json m = nlohmann::json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    if (!entries.empty()) m[std::string(kChecksumKey)] = sums.dump();
    header["__metadata__"] = std::move(m);
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  uint64_t n = text.size();
  unsigned char len[8];
  for (int b = 0; b < 8; ++b) len[b] = static_cast<unsigned char>(n >> (8 * b));

  AtomicWriter w(fn, path);
  w.write(len, 8);
  w.write(text.data(), n);
  for (size_t i : order) {
    const Array& a = entries[i].second;
    w.write(data[i], uint64_t(a.size()) * itemsize(a.dtype()));
  }
  w.commit();
}

namespace {

struct StEntry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin, end;
  std::optional<uint64_t> checksum;  // from the metadata's kChecksumKey, when the writer stored one
};

struct StFile {
  std::vector<StEntry> entries;  // sorted by name
  Metadata metadata;
  uint64_t data_start = 0;
};

StFile parse_safetensors(std::string_view fn, const fs::path& p, const InFile& f) {
  if (f.size() < 8)
    fail(fn, p,
         fmt::format("the file has {} bytes, too few for the 8-byte header length of a safetensors file", f.size()));
  unsigned char len[8];
  f.read(0, len, 8);
  uint64_t n = 0;
  for (int b = 0; b < 8; ++b) n |= uint64_t(len[b]) << (8 * b);
  if (n > f.size() - 8)
    fail(fn, p,
         fmt::format("the header length {} goes beyond the end of the file ({} bytes); the file is truncated "
                     "or not a safetensors file",
                     n, f.size()));
  if (n > kMaxHeader) fail(fn, p, fmt::format("the header length {} exceeds the 100 MiB limit", n));
  std::string text(n, '\0');
  f.read(8, text.data(), n);
  if (size_t z = text.find('\0'); z != std::string::npos)
    fail(fn, p, fmt::format("the header is not valid JSON (a NUL byte at header offset {})", z));
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail(fn, p, fmt::format("the header is not valid JSON ({})", e.what()));
  }
  if (!header.is_object()) fail(fn, p, "the header is not a JSON object");
  StFile out;
  out.data_start = 8 + n;
  uint64_t data_size = f.size() - out.data_start;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) fail(fn, p, "'__metadata__' is not a JSON object of strings");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) fail(fn, p, fmt::format("'__metadata__' entry '{}' is not a string", m.key()));
        out.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (!v.is_object()) fail(fn, p, fmt::format("tensor '{}': its header entry is not a JSON object", name));
    auto dt = v.find("dtype");
    auto sh = v.find("shape");
    auto off = v.find("data_offsets");
    if (dt == v.end() || sh == v.end() || off == v.end())
      fail(fn, p, fmt::format("tensor '{}': the header entry needs 'dtype', 'shape' and 'data_offsets'", name));
    if (!dt->is_string()) fail(fn, p, fmt::format("tensor '{}': 'dtype' is not a string", name));
    std::string dts = dt->get<std::string>();
    auto dtype = st_dtype(dts);
    if (!dtype)
      fail(fn, p,
           fmt::format("tensor '{}': unknown or unsupported dtype '{}' (cjax reads BOOL, I8, I16, I32, I64, "
                       "U8, U32, BF16, F16, F32, F64)",
                       name, dts));
    StEntry e{name, *dtype, {}, 0, 0, std::nullopt};
    if (!sh->is_array()) fail(fn, p, fmt::format("tensor '{}': 'shape' is not a list of integers", name));
    uint64_t numel = 1;
    for (const auto& d : *sh) {
      if (!d.is_number_unsigned())
        fail(fn, p,
             fmt::format("tensor '{}': 'shape' {} has an entry that is not a non-negative integer", name, sh->dump()));
      uint64_t dim = d.get<uint64_t>();
      if (dim > uint64_t(std::numeric_limits<int64_t>::max()) || mul_overflows(numel, dim, numel))
        fail(fn, p, fmt::format("tensor '{}': shape {} is too large", name, sh->dump()));
      e.shape.push_back(int64_t(dim));
    }
    uint64_t nbytes;
    if (mul_overflows(numel, itemsize(*dtype), nbytes))
      fail(fn, p, fmt::format("tensor '{}': shape {} is too large", name, sh->dump()));
    if (!off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() || !(*off)[1].is_number_unsigned())
      fail(fn, p,
           fmt::format("tensor '{}': 'data_offsets' {} is not a pair of non-negative integers", name, off->dump()));
    e.begin = (*off)[0].get<uint64_t>();
    e.end = (*off)[1].get<uint64_t>();
    if (e.begin > e.end)
      fail(fn, p, fmt::format("tensor '{}': data_offsets [{}, {}] end before they begin", name, e.begin, e.end));
    if (e.end > data_size)
      fail(fn, p,
           fmt::format("tensor '{}': data_offsets [{}, {}] are out of range: the data section has {} bytes "
                       "(the file is truncated or the header is corrupt)",
                       name, e.begin, e.end, data_size));
    if (e.end - e.begin != nbytes)
      fail(fn, p,
           fmt::format("tensor '{}': shape {} of {} needs {} bytes but data_offsets [{}, {}] span {} (shape/size "
                       "mismatch)",
                       name, shape_text(e.shape), dts, nbytes, e.begin, e.end, e.end - e.begin));
    out.entries.push_back(std::move(e));
  }
  // The tensors must tile the data section exactly: no overlaps, no gaps, nothing trailing.
  std::vector<const StEntry*> by_off;
  for (const auto& e : out.entries) by_off.push_back(&e);
  std::sort(by_off.begin(), by_off.end(), [](const StEntry* a, const StEntry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t pos = 0;
  const StEntry* prev = nullptr;
  for (const StEntry* e : by_off) {
    if (e->begin < pos)
      fail(fn, p,
           fmt::format("tensors '{}' [{}, {}] and '{}' [{}, {}] overlap in the data section", prev->name, prev->begin,
                       prev->end, e->name, e->begin, e->end));
    if (e->begin > pos)
      fail(fn, p,
           fmt::format("bytes [{}, {}) of the data section belong to no tensor (before '{}'); the offsets are "
                       "corrupt",
                       pos, e->begin, e->name));
    pos = e->end;
    prev = e;
  }
  if (pos != data_size)
    fail(fn, p,
         fmt::format("the data section has {} bytes but the tensors cover {}; the offsets are corrupt or "
                     "the file has trailing data",
                     data_size, pos));
  // Per-tensor checksums (files written by cjax): a JSON object {name: 16 hex digits} in the metadata.
  // Tensors without one (files from other tools) load unverified.
  if (auto it = out.metadata.find(std::string(kChecksumKey)); it != out.metadata.end()) {
    nlohmann::json sums;
    try {
      sums = nlohmann::json::parse(it->second);
    } catch (const nlohmann::json::exception&) {
      fail(fn, p, fmt::format("metadata '{}' is not a JSON object of checksums", kChecksumKey));
    }
    if (!sums.is_object()) fail(fn, p, fmt::format("metadata '{}' is not a JSON object of checksums", kChecksumKey));
    for (auto s = sums.begin(); s != sums.end(); ++s) {
      auto e = std::lower_bound(out.entries.begin(), out.entries.end(), s.key(),
                                [](const StEntry& x, const std::string& k) { return x.name < k; });
      if (e == out.entries.end() || e->name != s.key())
        fail(fn, p,
             fmt::format("metadata '{}' has a checksum for tensor '{}', which the file does not have", kChecksumKey,
                         s.key()));
      const std::string hex = s.value().is_string() ? s.value().get<std::string>() : std::string();
      uint64_t v = 0;
      bool ok = hex.size() == 16;
      for (char c : hex) {
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        ok &= d >= 0;
        v = v << 4 | uint64_t(d & 15);
      }
      if (!ok)
        fail(fn, p,
             fmt::format("metadata '{}': the checksum of tensor '{}' is not 16 hex digits: {}", kChecksumKey, s.key(),
                         s.value().dump()));
      e->checksum = v;
    }
    out.metadata.erase(it);
  }
  return out;
}

Array read_entry(std::string_view fn, const fs::path& p, const InFile& f, const StFile& st, const StEntry& e) {
  Array a = make_uninitialized(AbstractValue{e.shape, e.dtype, false, {}}, host_device());
  if (e.end > e.begin) f.read(st.data_start + e.begin, raw_ptr(a), e.end - e.begin);
  if (e.checksum) {
    uint64_t got = checksum(raw_ptr(a), e.end - e.begin);
    if (got != *e.checksum)
      fail(fn, p,
           fmt::format("checksum mismatch in tensor '{}': the header records xxh3_64 {:016x} but its {} bytes "
                       "hash to {:016x}; the file is corrupt",
                       e.name, *e.checksum, e.end - e.begin, got));
  }
  if (e.dtype == DType::bool_) normalize_bools(a);
  return on_default_device(a);
}

bool int_like(std::string_view s) {
  if (s.empty() || s.size() > 18) return false;
  if (s.size() > 1 && s[0] == '0') return false;
  return std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

std::vector<std::pair<std::string, Array>> load_safetensors_entries(const fs::path& path) {
  constexpr std::string_view fn = "io::load_safetensors";
  InFile f(fn, path);
  StFile st = parse_safetensors(fn, path, f);
  std::vector<std::pair<std::string, Array>> out;
  out.reserve(st.entries.size());
  for (const auto& e : st.entries) out.emplace_back(e.name, read_entry(fn, path, f, st, e));
  return out;
}

Array load_safetensors_tensor(const fs::path& path, std::string_view name) {
  constexpr std::string_view fn = "io::load_safetensors_tensor";
  InFile f(fn, path);
  StFile st = parse_safetensors(fn, path, f);
  for (const auto& e : st.entries)
    if (e.name == name) return read_entry(fn, path, f, st, e);
  fail(fn, path, fmt::format("has no tensor '{}'", name));
}

void write_file_atomically(std::string_view fn, const fs::path& path, std::string_view bytes) {
  AtomicWriter w(fn, path);
  w.write(bytes.data(), bytes.size());
  w.commit();
}

Metadata load_safetensors_metadata(const fs::path& path) {
  InFile f("io::load_safetensors_metadata", path);
  return parse_safetensors("io::load_safetensors_metadata", path, f).metadata;
}

Dict load_safetensors(const fs::path& path) {
  constexpr std::string_view fn = "io::load_safetensors";
  InFile f(fn, path);
  StFile st = parse_safetensors(fn, path, f);
  // Build the nesting first (validating names), then read the data.
  Dict root;  // None until the first name decides between a dict and a list
  for (const auto& e : st.entries) {
    std::vector<std::string_view> segs;
    std::string_view s(e.name);
    while (true) {
      size_t dot = s.find('.');
      segs.push_back(s.substr(0, dot));
      if (dot == std::string_view::npos) break;
      s.remove_prefix(dot + 1);
    }
    Dict* node = &root;
    std::string prefix;
    for (size_t i = 0; i < segs.size(); ++i) {
      std::string_view seg = segs[i];
      if (seg.empty())
        fail(fn, path, fmt::format("tensor name '{}' has an empty segment; names are '.'-joined key paths", e.name));
      bool is_int = int_like(seg);
      if (node->is_leaf())
        fail(fn, path,
             fmt::format("tensor '{}' needs '{}' to be a dict, but '{}' is itself a tensor", e.name, prefix, prefix));
      if ((is_int && node->is_map()) || (!is_int && node->is_list()))
        fail(fn, path,
             fmt::format("tensor names mix integer and string keys under '{}' (at '{}'); a level is either "
                         "a list or a dict",
                         prefix.empty() ? std::string("the root") : prefix, e.name));
      Dict& child = is_int ? (*node)[int64_t(std::stoll(std::string(seg)))] : (*node)[seg];
      prefix += (prefix.empty() ? "" : ".") + std::string(seg);
      if (i + 1 == segs.size()) {
        if (!child.is_none())
          fail(fn, path, fmt::format("tensor '{}' collides with other tensors nested under '{}'", e.name, e.name));
        child = read_entry(fn, path, f, st, e);
      }
      node = &child;
    }
  }
  if (root.is_none()) root = Dict::map();
  return root;
}

// ------------------------------------------------------------------------------------------------
// .npy

namespace {

struct NpyDType {
  char kind;  // b i u f
  int size;
  DType dtype;
};
constexpr NpyDType kNpyDTypes[] = {{'b', 1, DType::bool_},  {'i', 1, DType::int8},    {'i', 2, DType::int16},
                                   {'i', 4, DType::int32},  {'i', 8, DType::int64},   {'u', 1, DType::uint8},
                                   {'u', 4, DType::uint32}, {'f', 2, DType::float16}, {'f', 4, DType::float32},
                                   {'f', 8, DType::float64}};

std::string npy_descr(DType d) {
  for (const auto& e : kNpyDTypes)
    if (e.dtype == d) return fmt::format("{}{}{}", e.size == 1 ? '|' : '<', e.kind, e.size);
  return {};
}

// A tiny parser for the Python literal in an .npy header.
struct PyVal {
  enum Kind { Str, Int, Bool, None, Tuple, Dict } kind = None;
  std::string s;
  int64_t i = 0;
  bool b = false;
  std::vector<PyVal> items;                         // Tuple / list
  std::vector<std::pair<std::string, PyVal>> dict;  // Dict
};

class PyParser {
 public:
  PyParser(std::string_view t, std::string_view fn, const fs::path& p) : t_(t), fn_(fn), p_(p) {}
  PyVal value(int depth = 0) {
    if (depth > 32) err("nesting too deep");
    ws();
    if (pos_ >= t_.size()) err("unexpected end");
    char c = t_[pos_];
    PyVal v;
    if (c == '{') {
      v.kind = PyVal::Dict;
      ++pos_;
      while (true) {
        ws();
        if (peek('}')) break;
        PyVal k = value(depth + 1);
        if (k.kind != PyVal::Str) err("a dict key is not a string");
        ws();
        expect(':');
        v.dict.emplace_back(k.s, value(depth + 1));
        ws();
        if (peek('}')) break;
        expect(',');
      }
      return v;
    }
    if (c == '(' || c == '[') {
      char close = c == '(' ? ')' : ']';
      v.kind = PyVal::Tuple;
      ++pos_;
      while (true) {
        ws();
        if (peek(close)) break;
        v.items.push_back(value(depth + 1));
        ws();
        if (peek(close)) break;
        expect(',');
      }
      return v;
    }
    if (c == '\'' || c == '"') {
      v.kind = PyVal::Str;
      ++pos_;
      while (pos_ < t_.size() && t_[pos_] != c) {
        if (t_[pos_] == '\\') ++pos_;
        if (pos_ < t_.size()) v.s += t_[pos_++];
      }
      if (pos_ >= t_.size()) err("unterminated string");
      ++pos_;
      return v;
    }
    if ((c >= '0' && c <= '9') || c == '-') {
      v.kind = PyVal::Int;
      bool neg = c == '-';
      if (neg) ++pos_;
      if (pos_ >= t_.size() || t_[pos_] < '0' || t_[pos_] > '9') err("bad number");
      uint64_t x = 0;
      while (pos_ < t_.size() && t_[pos_] >= '0' && t_[pos_] <= '9') {
        if (x > uint64_t(std::numeric_limits<int64_t>::max()) / 10) err("integer too large");
        x = x * 10 + uint64_t(t_[pos_++] - '0');
      }
      if (pos_ < t_.size() && (t_[pos_] == 'L' || t_[pos_] == 'l')) ++pos_;  // Python 2 longs
      if (x > uint64_t(std::numeric_limits<int64_t>::max())) err("integer too large");
      v.i = neg ? -int64_t(x) : int64_t(x);
      return v;
    }
    for (auto [word, kind, bval] : {std::tuple{"True", PyVal::Bool, true}, std::tuple{"False", PyVal::Bool, false},
                                    std::tuple{"None", PyVal::None, false}}) {
      std::string_view w(word);
      if (t_.substr(pos_, w.size()) == w) {
        pos_ += w.size();
        v.kind = kind;
        v.b = bval;
        return v;
      }
    }
    err(fmt::format("unexpected character '{}'", c));
  }
  void finish() {
    ws();
    if (pos_ != t_.size()) err("trailing characters after the header dict");
  }

 private:
  void ws() {
    while (pos_ < t_.size() && (t_[pos_] == ' ' || t_[pos_] == '\n' || t_[pos_] == '\t' || t_[pos_] == '\r')) ++pos_;
  }
  bool peek(char c) {
    if (pos_ < t_.size() && t_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!peek(c)) err(fmt::format("expected '{}'", c));
  }
  [[noreturn]] void err(std::string_view what) {
    fail(fn_, p_,
         fmt::format("the .npy header is not a valid Python dict literal ({} at character {}): {}", what, pos_,
                     std::string(t_.substr(0, 200))));
  }
  std::string_view t_;
  std::string_view fn_;
  const fs::path& p_;
  size_t pos_ = 0;
};

void byteswap_inplace(void* data, int64_t n, size_t size) {
  auto* p = static_cast<unsigned char*>(data);
  for (int64_t i = 0; i < n; ++i, p += size) std::reverse(p, p + size);
}

template <class U>
void f_to_c(const U* src, U* dst, const Shape& shape) {
  size_t nd = shape.size();
  std::vector<int64_t> fstride(nd), idx(nd, 0);
  int64_t acc = 1;
  for (size_t k = 0; k < nd; ++k) {
    fstride[k] = acc;
    acc *= shape[k];
  }
  int64_t n = acc, off = 0;
  for (int64_t i = 0; i < n; ++i) {
    dst[i] = src[off];
    for (size_t k = nd; k-- > 0;) {  // odometer over the C-order index
      if (++idx[k] < shape[k]) {
        off += fstride[k];
        break;
      }
      off -= fstride[k] * (shape[k] - 1);
      idx[k] = 0;
    }
  }
}

}  // namespace

void save_npy(const fs::path& path, const Array& a) {
  constexpr std::string_view fn = "io::save_npy";
  if (a.defined() && a.dtype() == DType::bfloat16)
    fail(fn, path, "dtype bfloat16 has no .npy representation; use io::save_safetensors, or astype(f32) first");
  Array host = host_bytes(a, fn, path, "");
  const void* data = raw_ptr(host);
  std::string shape =
      a.ndim() == 1 ? fmt::format("({},)", a.shape()[0]) : fmt::format("({})", fmt::join(a.shape(), ", "));
  std::string dict =
      fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}", npy_descr(a.dtype()), shape);
  size_t prefix = 10;
  unsigned char major = 1;
  if (dict.size() + 1 + 64 > 65535) {
    prefix = 12;
    major = 2;
  }
  size_t total = prefix + dict.size() + 1;
  dict.append((64 - total % 64) % 64, ' ');
  dict += '\n';
  std::string head("\x93NUMPY", 6);
  head += char(major);
  head += char(0);
  uint64_t hl = dict.size();
  for (size_t b = 0; b < prefix - 8; ++b) head += char((hl >> (8 * b)) & 0xff);
  AtomicWriter w(fn, path);
  w.write(head.data(), head.size());
  w.write(dict.data(), dict.size());
  w.write(data, uint64_t(a.size()) * itemsize(a.dtype()));
  w.commit();
}

Array load_npy(const fs::path& path) {
  constexpr std::string_view fn = "io::load_npy";
  InFile f(fn, path);
  if (f.size() < 10) fail(fn, path, fmt::format("the file has {} bytes, too few for an .npy header", f.size()));
  unsigned char pre[12] = {};
  f.read(0, pre, std::min<uint64_t>(12, f.size()));
  if (std::memcmp(pre, "\x93NUMPY", 6) != 0)
    fail(fn, path, "not an .npy file (the magic string \\x93NUMPY is missing)");
  int major = pre[6], minor = pre[7];
  if (major < 1 || major > 3 || minor != 0)
    fail(fn, path, fmt::format("unsupported .npy format version {}.{} (cjax reads 1.0, 2.0 and 3.0)", major, minor));
  uint64_t hl, hstart;
  if (major == 1) {
    hl = uint64_t(pre[8]) | uint64_t(pre[9]) << 8;
    hstart = 10;
  } else {
    if (f.size() < 12) fail(fn, path, "truncated: the file ends inside the header length");
    hl = uint64_t(pre[8]) | uint64_t(pre[9]) << 8 | uint64_t(pre[10]) << 16 | uint64_t(pre[11]) << 24;
    hstart = 12;
  }
  if (hl > f.size() - hstart)
    fail(fn, path,
         fmt::format("the header length {} goes beyond the end of the file ({} bytes); the file is truncated", hl,
                     f.size()));
  std::string text(hl, '\0');
  f.read(hstart, text.data(), hl);
  PyParser parser(text, fn, path);
  PyVal d = parser.value();
  parser.finish();
  if (d.kind != PyVal::Dict) fail(fn, path, "the .npy header is not a dict");
  const PyVal *descr = nullptr, *fortran = nullptr, *shape = nullptr;
  for (const auto& [k, v] : d.dict) {
    if (k == "descr")
      descr = &v;
    else if (k == "fortran_order")
      fortran = &v;
    else if (k == "shape")
      shape = &v;
    else
      fail(fn, path, fmt::format("the .npy header has an unexpected key '{}'", k));
  }
  if (!descr || !fortran || !shape) fail(fn, path, "the .npy header needs 'descr', 'fortran_order' and 'shape'");
  if (descr->kind != PyVal::Str)
    fail(fn, path, "unsupported dtype: structured (record) dtypes are not supported; 'descr' must be a string");
  if (fortran->kind != PyVal::Bool) fail(fn, path, "'fortran_order' is not True or False");
  if (shape->kind != PyVal::Tuple) fail(fn, path, "'shape' is not a tuple");
  // descr: byte order + kind + size.
  const std::string& ds = descr->s;
  std::optional<DType> dtype;
  bool swap = false;
  if (ds.size() >= 3 && (ds[0] == '<' || ds[0] == '>' || ds[0] == '|' || ds[0] == '=')) {
    char kind = ds[1];
    std::string_view sz(ds.data() + 2, ds.size() - 2);
    for (const auto& e : kNpyDTypes)
      if (e.kind == kind && sz == std::to_string(e.size)) {
        dtype = e.dtype;
        swap = ds[0] == '>' && e.size > 1;
      }
  }
  if (!dtype)
    fail(fn, path,
         fmt::format("unsupported dtype '{}' (cjax reads '|b1', '|i1', '<i2', '<i4', '<i8', '|u1', '<u4', "
                     "'<f2', '<f4', '<f8')",
                     ds));
  Shape shp;
  uint64_t numel = 1;
  for (const auto& s : shape->items) {
    if (s.kind != PyVal::Int || s.i < 0) fail(fn, path, "'shape' has an entry that is not a non-negative integer");
    if (mul_overflows(numel, uint64_t(s.i), numel)) fail(fn, path, "'shape' is too large");
    shp.push_back(s.i);
  }
  uint64_t nbytes;
  if (mul_overflows(numel, itemsize(*dtype), nbytes)) fail(fn, path, "'shape' is too large");
  uint64_t dstart = hstart + hl, avail = f.size() - dstart;
  if (avail < nbytes)
    fail(fn, path,
         fmt::format("truncated data: shape {} of {} needs {} bytes after the header, the file has {}", shape_str(shp),
                     ds, nbytes, avail));
  if (avail > nbytes)
    fail(fn, path,
         fmt::format("shape/size mismatch: shape {} of {} needs {} bytes after the header, the file has {}",
                     shape_str(shp), ds, nbytes, avail));
  Array a = make_uninitialized(AbstractValue{shp, *dtype, false, {}}, host_device());
  size_t isz = itemsize(*dtype);
  if (fortran->b && shp.size() >= 2 && numel > 1) {
    // Staging through a device buffer: an allocation failure is the allocator's BackendError.
    Array staging = make_uninitialized(AbstractValue{{int64_t(nbytes)}, DType::uint8, false, {}}, host_device());
    auto* tmp = static_cast<unsigned char*>(raw_ptr(staging));
    f.read(dstart, tmp, nbytes);
    void* dst = raw_ptr(a);
    switch (isz) {
      case 1: f_to_c(tmp, static_cast<uint8_t*>(dst), shp); break;
      case 2: f_to_c(reinterpret_cast<const uint16_t*>(tmp), static_cast<uint16_t*>(dst), shp); break;
      case 4: f_to_c(reinterpret_cast<const uint32_t*>(tmp), static_cast<uint32_t*>(dst), shp); break;
      default: f_to_c(reinterpret_cast<const uint64_t*>(tmp), static_cast<uint64_t*>(dst), shp); break;
    }
  } else if (nbytes) {
    f.read(dstart, raw_ptr(a), nbytes);
  }
  if (swap) byteswap_inplace(raw_ptr(a), a.size(), isz);
  if (*dtype == DType::bool_) normalize_bools(a);
  return on_default_device(a);
}

// ------------------------------------------------------------------------------------------------
// Temporaries left by killed writers

int remove_stale_temporaries(const fs::path& target) {
  if (!target.has_filename()) return 0;
  fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  const std::string prefix = tmp_prefix(target);
  std::error_code ec;
  fs::directory_iterator it(dir, ec), end;
  int removed = 0;
  for (; !ec && it != end; it.increment(ec)) {
    std::string name = it->path().filename().string();
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    // The rest must be exactly "<pid>.<n>", both decimal.
    std::string_view rest = std::string_view(name).substr(prefix.size());
    size_t dot = rest.find('.');
    auto digits = [](std::string_view s) {
      return !s.empty() && s.size() <= 18 &&
             std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
    };
    if (dot == std::string_view::npos || !digits(rest.substr(0, dot)) || !digits(rest.substr(dot + 1))) continue;
    long long pid = std::stoll(std::string(rest.substr(0, dot)));
    // A temporary of this process or of a live one may be a write in progress: leave it.
    if (pid == ::getpid()) continue;
    if (pid > 0 && pid <= std::numeric_limits<pid_t>::max() && (::kill(pid_t(pid), 0) == 0 || errno != ESRCH)) continue;
    std::error_code rec;
    if (fs::remove(it->path(), rec)) ++removed;
  }
  return removed;
}

}  // namespace cjax::io
