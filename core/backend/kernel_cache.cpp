#include "core/backend/kernel_cache.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <list>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

namespace cjax {
namespace {

constexpr std::string_view kCacheMagic = "CJAXOBJ1";

struct Cache {
  std::mutex mu;
  // In memory: most recently used first, bounded by bytes.
  std::list<std::pair<std::string, std::string>> lru;
  std::unordered_map<std::string, decltype(lru)::iterator> index;
  size_t bytes = 0;
  static constexpr size_t kMaxBytes = size_t(256) << 20;
  std::atomic<int64_t> memory_hits{0}, disk_hits{0}, misses{0}, disk_writes{0};

  void remember(const std::string& key, std::string object) {
    std::lock_guard lk(mu);
    if (auto it = index.find(key); it != index.end()) {  // stored again: the latest bytes win
      bytes -= it->second->second.size() + key.size();
      lru.erase(it->second);
      index.erase(it);
    }
    bytes += object.size() + key.size();
    lru.emplace_front(key, std::move(object));
    index[key] = lru.begin();
    while (bytes > kMaxBytes && lru.size() > 1) {
      bytes -= lru.back().first.size() + lru.back().second.size();
      index.erase(lru.back().first);
      lru.pop_back();
    }
  }
};
Cache& cache() {
  static Cache c;
  return c;
}

std::filesystem::path cache_dir() {
  if (const char* d = std::getenv("CJAX_CACHE_DIR")) return d;  // "" disables the disk cache
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::filesystem::path(x) / "cjax";
  if (const char* h = std::getenv("HOME"); h && *h) return std::filesystem::path(h) / ".cache" / "cjax";
  return {};
}

// CJAX_CACHE_MAX_MB (default 512; fractions allowed): the disk cache's size cap.
uint64_t disk_cache_limit() {
  const char* v = std::getenv("CJAX_CACHE_MAX_MB");
  double mb = v && *v ? std::strtod(v, nullptr) : 512.0;
  return uint64_t(std::max(0.0, mb) * 1024.0 * 1024.0);
}

// FNV-1a over the key, twice with different offsets: 128 bits name the file (the key inside it
// decides a hit).
uint64_t fnv1a(std::string_view s, uint64_t h) {
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}
std::filesystem::path cache_file(const std::filesystem::path& dir, const std::string& fkey) {
  return dir / fmt::format("{:016x}{:016x}.o", fnv1a(fkey, 0xcbf29ce484222325ULL), fnv1a(fkey, 0x84222325cbf29ce4ULL));
}

}  // namespace

std::optional<std::string> cached_kernel(const std::string& fkey) {
  Cache& c = cache();
  {
    std::lock_guard lk(c.mu);
    if (auto it = c.index.find(fkey); it != c.index.end()) {
      c.lru.splice(c.lru.begin(), c.lru, it->second);
      ++c.memory_hits;
      return it->second->second;
    }
  }
  std::filesystem::path dir = cache_dir();
  if (!dir.empty()) {
    std::ifstream in(cache_file(dir, fkey), std::ios::binary);
    if (in) {
      std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      // Layout: magic, key length (decimal) '\n', key, object bytes.
      size_t nl = data.find('\n', kCacheMagic.size());
      if (data.compare(0, kCacheMagic.size(), kCacheMagic) == 0 && nl != std::string::npos) {
        size_t klen = std::strtoull(data.c_str() + kCacheMagic.size(), nullptr, 10);
        if (nl + 1 + klen <= data.size() && data.compare(nl + 1, klen, fkey) == 0) {
          std::string object = data.substr(nl + 1 + klen);
          ++c.disk_hits;
          std::error_code ec;  // recency for trim_disk_kernel_cache (least recently used goes first)
          std::filesystem::last_write_time(cache_file(dir, fkey), std::filesystem::file_time_type::clock::now(), ec);
          c.remember(fkey, object);
          return object;
        }
      }
    }
  }
  ++c.misses;
  return std::nullopt;
}

void store_kernel(const std::string& fkey, std::string_view object) {
  Cache& c = cache();
  c.remember(fkey, std::string(object));
  std::filesystem::path dir = cache_dir();
  if (dir.empty()) return;
  // The disk cache is an optimisation: an unwritable directory only costs recompiles.
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return;
  std::filesystem::path file = cache_file(dir, fkey);
  std::filesystem::path tmp = file;
  tmp += fmt::format(".tmp{}.{}", ::getpid(), std::hash<std::thread::id>()(std::this_thread::get_id()));
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return;
    out << kCacheMagic << fkey.size() << '\n' << fkey;
    out.write(object.data(), std::streamsize(object.size()));
    if (!out) {
      out.close();
      std::filesystem::remove(tmp, ec);
      return;
    }
  }
  std::filesystem::rename(tmp, file, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    return;
  }
  // Trim on this process's first write and every 64th after: a directory listing per write would
  // cost more than it saves.
  if (++c.disk_writes % 64 == 1) trim_disk_kernel_cache();
}

void trim_disk_kernel_cache() {
  std::filesystem::path dir = cache_dir();
  if (dir.empty()) return;
  uint64_t limit = disk_cache_limit();
  struct Entry {
    std::filesystem::file_time_type time;
    uint64_t size;
    std::filesystem::path path;
  };
  std::vector<Entry> entries;
  uint64_t total = 0;
  std::error_code ec;
  auto now = std::filesystem::file_time_type::clock::now();
  for (auto it = std::filesystem::directory_iterator(dir, ec); !ec && it != std::filesystem::directory_iterator();
       it.increment(ec)) {
    std::error_code fe;
    const std::filesystem::path& path = it->path();
    auto time = it->last_write_time(fe);
    uint64_t size = it->file_size(fe);
    if (fe) continue;
    // A temporary file an hour old belongs to a writer that died.
    if (path.filename().string().find(".o.tmp") != std::string::npos) {
      if (now - time > std::chrono::hours(1)) std::filesystem::remove(path, fe);
      continue;
    }
    if (path.extension() != ".o") continue;
    entries.push_back({time, size, path});
    total += size;
  }
  if (total <= limit) return;
  // Least recently used first, down to 80% of the cap (so that trims stay rare).
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.time < b.time; });
  for (const Entry& e : entries) {
    if (total <= limit / 5 * 4) break;
    std::error_code fe;
    if (std::filesystem::remove(e.path, fe)) total -= e.size;
  }
}

KernelCacheStats kernel_cache_stats() {
  Cache& c = cache();
  return {c.memory_hits.load(), c.disk_hits.load(), c.misses.load(), c.disk_writes.load()};
}

void clear_memory_kernel_cache() {
  Cache& c = cache();
  std::lock_guard lk(c.mu);
  c.lru.clear();
  c.index.clear();
  c.bytes = 0;
}

}  // namespace cjax
