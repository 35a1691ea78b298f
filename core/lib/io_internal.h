// What io.cpp shares with the other writers of core/lib (sharded_io.cpp).
#pragma once
#include <filesystem>
#include <string_view>

namespace cjax::io {
// IoError "<fn>: '<path>': <problem>", as every reader and writer of core/lib words its errors.
[[noreturn]] void fail(std::string_view fn, const std::filesystem::path& path, std::string_view problem);
// Writes `bytes` to a temporary beside `path`, fsyncs it and renames it over `path` (io.h's atomic
// writes); IoError prefixed with `fn` on failure, the old file untouched.
void write_file_atomically(std::string_view fn, const std::filesystem::path& path, std::string_view bytes);
}  // namespace cjax::io
