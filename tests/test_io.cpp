// cjax::io: safetensors and .npy round trips, numpy-written fixtures, atomic writes, corrupt files.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "cjax/cjax.h"
#include "core/array/array_impl.h"

using namespace cjax;
namespace jnp = cjax::numpy;
namespace fs = std::filesystem;

namespace {

const fs::path kData = CJAX_TEST_DATA_DIR;

// A fresh scratch directory per test case, removed afterwards.
struct TmpDir {
  fs::path dir;
  TmpDir() {
    static int n = 0;
    dir = fs::temp_directory_path() / ("cjax_test_io_" + std::to_string(::getpid()) + "_" + std::to_string(n++));
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~TmpDir() {
    std::error_code ec;
    fs::permissions(dir, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(dir, ec);
  }
  fs::path operator/(const std::string& f) const { return dir / f; }
  size_t count() const { return size_t(std::distance(fs::directory_iterator(dir), fs::directory_iterator())); }
};

std::string read_all(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}
void write_all(const fs::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(s.data(), std::streamsize(s.size()));
}
std::string bytes(const Array& a) {
  return std::string(static_cast<const char*>(raw_ptr(a)), size_t(a.size()) * itemsize(a.dtype()));
}
// A safetensors file from a header text and a data section (the header is padded to 8 bytes).
std::string st_file(std::string header, const std::string& data) {
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int b = 0; b < 8; ++b) out[size_t(b)] = char((n >> (8 * b)) & 0xff);
  return out + header + data;
}

// One array per dtype, with edge values.
std::vector<std::pair<std::string, Array>> all_dtypes() {
  std::vector<std::pair<std::string, Array>> v;
  v.emplace_back("bool", jnp::array<bool>({true, false, true, true}, {2, 2}));
  v.emplace_back("i8", jnp::array<int8_t>({-128, 127, 0, -1}));
  v.emplace_back("i16", jnp::array<int16_t>({-32768, 32767, 1}));
  v.emplace_back("i32",
                 jnp::array<int32_t>({std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()}));
  v.emplace_back("i64",
                 jnp::array<int64_t>({std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), 3},
                                     {3, 1}));
  v.emplace_back("u8", jnp::array<uint8_t>({0, 255, 17}));
  v.emplace_back("u32", jnp::array<uint32_t>({0, 4294967295u, 123456789u}));
  v.emplace_back("bf16", jnp::array<bfloat16_t>({bfloat16_t(1.f), bfloat16_t(-3.f), bfloat16_t(1e30f),
                                                 bfloat16_t(std::numeric_limits<float>::infinity())}));
  v.emplace_back("f16", jnp::array<float16_t>({float16_t(65504.f), float16_t(-0.5f), float16_t(6.1035156e-05f)}));
  v.emplace_back("f32", jnp::array<float>({1.5f, -0.f, std::numeric_limits<float>::quiet_NaN(),
                                           std::numeric_limits<float>::denorm_min(), 3e38f, 7.f},
                                          {2, 3}));
  v.emplace_back("f64", jnp::array<double>({0.1, -1e300, std::numeric_limits<double>::infinity()}));
  v.emplace_back("scalar", jnp::array<float>({2.5f}, Shape{}));
  v.emplace_back("empty", jnp::array<float>(std::vector<float>{}, {0, 3}));
  return v;
}

}  // namespace

TEST_CASE("npy round trip for every npy dtype, byte-exact; bf16 refused") {
  TmpDir tmp;
  for (auto& [name, a] : all_dtypes()) {
    CAPTURE(name);
    fs::path p = tmp / (name + ".npy");
    if (a.dtype() == bf16) {
      CHECK_THROWS_WITH_AS(io::save_npy(p, a), doctest::Contains("bfloat16"), IoError);
      CHECK_THROWS_WITH_AS(io::save_npy(p, a), doctest::Contains(p.string().c_str()), IoError);
      CHECK(!fs::exists(p));
      continue;
    }
    io::save_npy(p, a);
    std::string file = read_all(p);
    CHECK(file.size() % 64 == bytes(a).size() % 64);  // header aligned to 64 as numpy writes it
    CHECK(file.substr(0, 8) == std::string("\x93NUMPY\x01\x00", 8));
    Array b = io::load_npy(p);
    CHECK(b.dtype() == a.dtype());
    CHECK(b.shape() == a.shape());
    CHECK(bytes(b) == bytes(a));
  }
  CHECK(tmp.count() == all_dtypes().size() - 1);  // no temporary files left behind
}

TEST_CASE("npy written by cjax is byte-identical to numpy's files") {
  TmpDir tmp;
  for (const char* f : {"f4.npy", "f8.npy", "f2.npy", "b1.npy", "u1.npy", "u4.npy", "i1.npy", "i2.npy", "i4.npy",
                        "i8.npy", "scalar_f8.npy", "empty_f4.npy"}) {
    CAPTURE(f);
    Array a = io::load_npy(kData / f);
    io::save_npy(tmp / f, a);
    CHECK(read_all(tmp / f) == read_all(kData / f));
  }
}

TEST_CASE("npy fixtures written by numpy load with the right values") {
  Array f4 = io::load_npy(kData / "f4.npy");
  CHECK(f4.dtype() == f32);
  CHECK(f4.shape() == Shape{2, 3});
  auto v = f4.to_vector<float>();
  CHECK(v[0] == 1.5f);
  CHECK(v[1] == -2.25f);
  CHECK(v[2] == 3.0e38f);
  CHECK(v[3] == std::numeric_limits<float>::infinity());
  CHECK(v[4] == 0.f);
  CHECK(std::signbit(v[4]));
  CHECK(v[5] == std::numeric_limits<float>::denorm_min());
  CHECK(io::load_npy(kData / "f8.npy").to_vector<double>() == std::vector<double>{0.1, -1e300, 2.5});
  Array f2 = io::load_npy(kData / "f2.npy");
  CHECK(f2.dtype() == f16);
  CHECK(f2.to_vector<float>() == std::vector<float>{1.f, -0.5f, 65504.f, 6.103515625e-05f});
  Array b1 = io::load_npy(kData / "b1.npy");
  CHECK(b1.dtype() == bool_);
  CHECK(b1.to_vector<bool>() == std::vector<bool>{true, false, true});
  CHECK(io::load_npy(kData / "u1.npy").to_vector<uint8_t>() == std::vector<uint8_t>{0, 255, 7});
  CHECK(io::load_npy(kData / "u4.npy").to_vector<uint32_t>() == std::vector<uint32_t>{0, 4294967295u, 123456789u});
  CHECK(io::load_npy(kData / "i1.npy").to_vector<int8_t>() == std::vector<int8_t>{-128, 127, 0});
  CHECK(io::load_npy(kData / "i2.npy").to_vector<int16_t>() == std::vector<int16_t>{-32768, 32767, -1});
  CHECK(io::load_npy(kData / "i4.npy").to_vector<int32_t>() ==
        std::vector<int32_t>{std::numeric_limits<int32_t>::min(), 2147483647, 42});
  Array i8 = io::load_npy(kData / "i8.npy");
  CHECK(i8.dtype() == i64);
  CHECK(i8.to_vector<int64_t>() ==
        std::vector<int64_t>{std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), 5});
  Array sc = io::load_npy(kData / "scalar_f8.npy");
  CHECK(sc.shape() == Shape{});
  CHECK(sc.item<double>() == 3.5);
  Array em = io::load_npy(kData / "empty_f4.npy");
  CHECK(em.shape() == Shape{0, 3});
  CHECK(em.size() == 0);
  // Fortran order is transposed into row-major data.
  Array ff = io::load_npy(kData / "fortran_f4.npy");
  CHECK(ff.shape() == Shape{2, 3});
  CHECK(ff.to_vector<float>() == std::vector<float>{0, 1, 2, 3, 4, 5});
  Array fi = io::load_npy(kData / "fortran_i2.npy");
  CHECK(fi.shape() == Shape{2, 3, 4});
  std::vector<int16_t> iota(24);
  for (int i = 0; i < 24; ++i) iota[size_t(i)] = int16_t(i);
  CHECK(fi.to_vector<int16_t>() == iota);
  // Big-endian data is byte-swapped; version 2.0 headers are read.
  Array be = io::load_npy(kData / "big_endian_i4.npy");
  CHECK(be.dtype() == i32);
  CHECK(be.to_vector<int32_t>() == std::vector<int32_t>{1, -2, 300});
  Array v2 = io::load_npy(kData / "v2_f4.npy");
  CHECK(v2.shape() == Shape{2, 2});
  CHECK(v2.to_vector<float>() == std::vector<float>{0, 1, 2, 3});
  // complex64 is not a cjax dtype.
  fs::path c8 = kData / "c8.npy";
  CHECK_THROWS_WITH_AS(io::load_npy(c8), doctest::Contains("unsupported dtype '<c8'"), IoError);
  CHECK_THROWS_WITH_AS(io::load_npy(c8), doctest::Contains(c8.string().c_str()), IoError);
}

TEST_CASE("safetensors round trip of a nested Dict, every dtype, metadata") {
  TmpDir tmp;
  Dict d;
  auto all = all_dtypes();
  for (size_t i = 0; i < all.size(); ++i) d["layers"][int64_t(i % 3)][all[i].first] = all[i].second;
  d["top"] = jnp::array<float>({1, 2});
  fs::path p = tmp / "ckpt.safetensors";
  io::save_safetensors(p, d, {{"step", "100"}, {"format", "cjax"}});
  Dict back = io::load_safetensors(p);
  CHECK(tree::structure(back) == tree::structure(d));
  CHECK(back.str() == d.str());
  auto l1 = tree::leaves_with_path(d), l2 = tree::leaves_with_path(back);
  REQUIRE(l1.size() == l2.size());
  for (size_t i = 0; i < l1.size(); ++i) {
    CAPTURE(l1[i].first.str());
    CHECK(l1[i].first == l2[i].first);
    CHECK(l2[i].second.dtype() == l1[i].second.dtype());
    CHECK(l2[i].second.shape() == l1[i].second.shape());
    CHECK(bytes(l2[i].second) == bytes(l1[i].second));
  }
  CHECK(io::load_safetensors_metadata(p) == io::Metadata{{"format", "cjax"}, {"step", "100"}});
  // File layout: 8-byte little-endian length, header padded with spaces to 8 bytes, dotted names.
  std::string file = read_all(p);
  uint64_t n = 0;
  for (int b = 0; b < 8; ++b) n |= uint64_t(uint8_t(file[size_t(b)])) << (8 * b);
  CHECK(n % 8 == 0);
  CHECK(file[8] == '{');
  std::string header = file.substr(8, n);
  CHECK(header.find("\"layers.0.bool\":{\"data_offsets\":[0,4],\"dtype\":\"BOOL\",\"shape\":[2,2]}") !=
        std::string::npos);
  CHECK(header.find("\"layers.1.bf16\"") != std::string::npos);
  CHECK(header.find("\"dtype\":\"BF16\"") != std::string::npos);
  CHECK(header.find("\"__metadata__\":{\"cjax.checksums.xxh3_64\":") != std::string::npos);
  CHECK(header.find("\"format\":\"cjax\",\"step\":\"100\"}") != std::string::npos);
  CHECK(header.find_last_not_of(' ') + 1 >= n - 7);
  // Entries API.
  auto entries = io::load_safetensors_entries(p);
  CHECK(entries.size() == all.size() + 1);
  CHECK(entries.front().first == "layers.0.bool");
  CHECK(entries.back().first == "top");
  // An empty tree is a valid file.
  io::save_safetensors(tmp / "empty.safetensors", Dict::map());
  CHECK(io::load_safetensors(tmp / "empty.safetensors").str() == "{}");
  CHECK(tmp.count() == 2);
}

namespace iotest {
struct Block {
  Array w;
  std::vector<Array> bs;
};
CJAX_TREE(Block, w, bs)
}  // namespace iotest

TEST_CASE("safetensors of typed trees uses '.'-joined key paths") {
  TmpDir tmp;
  std::tuple<iotest::Block, std::map<std::string, Array>> t{iotest::Block{jnp::array<float>({1}),
                                                                          {jnp::array<int32_t>({2}),
                                                                           jnp::array<int32_t>({3})}},
                                                            {{"emb", jnp::array<float>({4})}}};
  io::save_safetensors(tmp / "t.safetensors", t);
  auto entries = io::load_safetensors_entries(tmp / "t.safetensors");
  std::vector<std::string> names;
  for (auto& [n, a] : entries) names.push_back(n);
  CHECK(names == std::vector<std::string>{"0.bs.0", "0.bs.1", "0.w", "1.emb"});
  Dict d = io::load_safetensors(tmp / "t.safetensors");
  CHECK(d.str() == "[{'bs': [i32[1], i32[1]], 'w': f32[1]}, {'emb': f32[1]}]");
  CHECK(d[0]["bs"][1].array().item<int32_t>() == 3);
  // Keys that cannot round-trip are refused before any file is created.
  Dict bad;
  bad["a.b"] = jnp::array<float>({1});
  CHECK_THROWS_WITH_AS(io::save_safetensors(tmp / "bad.safetensors", jnp::array<float>({1})),
                       doctest::Contains("empty name"), ValueError);
  std::vector<std::pair<std::string, Array>> dup{{"x", jnp::array<float>({1})}, {"x", jnp::array<float>({2})}};
  CHECK_THROWS_WITH_AS(io::save_safetensors_entries(tmp / "dup.safetensors", dup),
                       doctest::Contains("two arrays are both named 'x'"), ValueError);
  CHECK(!fs::exists(tmp / "bad.safetensors"));
  CHECK(!fs::exists(tmp / "dup.safetensors"));
}

TEST_CASE("safetensors fixture written by Python loads into a nested Dict") {
  fs::path p = kData / "nested.safetensors";
  Dict d = io::load_safetensors(p);
  CHECK(d.str() ==
        "{'bf': bf16[2], 'big': i64[2], 'count': i32[], 'embed': f16[3], 'layers': [{'mlp': {'w': f32[2,2]}}, "
        "{'mlp': {'w': f32[2,2]}}], 'mask': bool[2]}");
  CHECK(d["layers"][0]["mlp"]["w"].array().to_vector<float>() == std::vector<float>{1, 2, 3, 4});
  CHECK(d["layers"][1]["mlp"]["w"].array().to_vector<float>() == std::vector<float>{5, 6, 7, 8});
  CHECK(d["embed"].array().to_vector<float>() == std::vector<float>{0.5f, -1.f, 2.f});
  CHECK(d["count"].array().item<int32_t>() == 7);
  CHECK(d["mask"].array().to_vector<bool>() == std::vector<bool>{true, false});
  CHECK(d["big"].array().to_vector<int64_t>() == std::vector<int64_t>{-1, int64_t(1) << 40});
  CHECK(d["bf"].array().to_vector<float>() == std::vector<float>{1.f, -3.f});
  CHECK(io::load_safetensors_metadata(p) == io::Metadata{{"format", "np"}, {"step", "12"}});
}

TEST_CASE("writes are atomic: a failed save leaves the old file intact and no temporary behind") {
  TmpDir tmp;
  fs::path p = tmp / "ckpt.safetensors";
  Dict small;
  small["w"] = jnp::array<float>({1, 2, 3});
  io::save_safetensors(p, small);
  const std::string old = read_all(p);
  REQUIRE(!old.empty());

  SUBCASE("the write fails midway (file size limit)") {
    Dict big;
    big["a"] = jnp::array<float>(std::vector<float>(1000, 1.f));
    big["b"] = jnp::array<float>(std::vector<float>(100000, 2.f));
    auto prev = std::signal(SIGXFSZ, SIG_IGN);
    rlimit old_lim{};
    REQUIRE(getrlimit(RLIMIT_FSIZE, &old_lim) == 0);
    rlimit lim = old_lim;
    lim.rlim_cur = 16384;
    REQUIRE(setrlimit(RLIMIT_FSIZE, &lim) == 0);
    bool threw = false;
    std::string msg;
    try {
      io::save_safetensors(p, big);
    } catch (const IoError& e) {
      threw = true;
      msg = e.what();
    }
    setrlimit(RLIMIT_FSIZE, &old_lim);
    std::signal(SIGXFSZ, prev);
    CHECK(threw);
    CHECK(msg.find(p.string()) != std::string::npos);
    CHECK(msg.find("write failed") != std::string::npos);
    CHECK(read_all(p) == old);
    CHECK(tmp.count() == 1);
    // npy too.
    fs::path q = tmp / "x.npy";
    io::save_npy(q, jnp::array<float>({1}));
    std::string oldq = read_all(q);
    REQUIRE(setrlimit(RLIMIT_FSIZE, &lim) == 0);
    std::signal(SIGXFSZ, SIG_IGN);
    CHECK_THROWS_WITH_AS(io::save_npy(q, jnp::array<float>(std::vector<float>(100000, 2.f))),
                         doctest::Contains(q.string().c_str()), IoError);
    setrlimit(RLIMIT_FSIZE, &old_lim);
    std::signal(SIGXFSZ, prev);
    CHECK(read_all(q) == oldq);
    CHECK(tmp.count() == 2);
  }
  SUBCASE("a leaf cannot be saved (abstract value): nothing is written") {
    Dict bad;
    bad["a"] = jnp::array<float>({5});
    bad["z"] = make_abstract(AbstractValue{{2}, f32, false, {}});
    CHECK_THROWS_AS(io::save_safetensors(p, bad), ConcretizationError);
    CHECK(read_all(p) == old);
    CHECK(tmp.count() == 1);
  }
  SUBCASE("the directory does not exist") {
    fs::path q = tmp / "no_such_dir" / "ckpt.safetensors";
    CHECK_THROWS_WITH_AS(io::save_safetensors(q, small), doctest::Contains(q.string().c_str()), IoError);
    CHECK_THROWS_WITH_AS(io::save_npy(q, jnp::array<float>({1})), doctest::Contains("cannot create a temporary file"),
                         IoError);
  }
  SUBCASE("the directory is not writable (skipped when running as root)") {
    if (::geteuid() != 0) {
      fs::permissions(tmp.dir, fs::perms::owner_write | fs::perms::group_write | fs::perms::others_write,
                      fs::perm_options::remove);
      CHECK_THROWS_WITH_AS(io::save_safetensors(p, small), doctest::Contains(p.string().c_str()), IoError);
      fs::permissions(tmp.dir, fs::perms::owner_write, fs::perm_options::add);
      CHECK(read_all(p) == old);
    }
  }
  SUBCASE("a successful save replaces the file") {
    Dict other;
    other["v"] = jnp::array<int32_t>({4});
    io::save_safetensors(p, other);
    CHECK(io::load_safetensors(p)["v"].array().item<int32_t>() == 4);
    CHECK(tmp.count() == 1);
  }
}

TEST_CASE("corrupt safetensors files raise IoError naming the file and the problem") {
  TmpDir tmp;
  fs::path good = tmp / "good.safetensors";
  Dict d;
  d["a"] = jnp::array<float>({1, 2, 3, 4});
  d["b"] = jnp::array<int32_t>({5, 6});
  io::save_safetensors(good, d);
  const std::string file = read_all(good);
  uint64_t n = 0;
  for (int b = 0; b < 8; ++b) n |= uint64_t(uint8_t(file[size_t(b)])) << (8 * b);
  fs::path p = tmp / "bad.safetensors";
  auto expect_error = [&](const std::string& content, const std::string& problem) {
    CAPTURE(problem);
    write_all(p, content);
    CHECK_THROWS_WITH_AS(io::load_safetensors(p), doctest::Contains(p.string().c_str()), IoError);
    CHECK_THROWS_WITH_AS(io::load_safetensors(p), doctest::Contains(problem.c_str()), IoError);
  };
  // Truncations at several offsets.
  expect_error("", "too few for the 8-byte header length");
  expect_error(file.substr(0, 5), "too few for the 8-byte header length");
  expect_error(file.substr(0, 20), "goes beyond the end of the file");
  expect_error(file.substr(0, 8 + n), "out of range");
  expect_error(file.substr(0, 8 + n + 10), "out of range");
  expect_error(file.substr(0, file.size() - 1), "out of range");
  // Trailing bytes after the last tensor.
  expect_error(file + "xyz", "the data section has 27 bytes but the tensors cover 24");
  // Corrupt header length.
  {
    std::string f = file;
    f[5] = '\x01';
    expect_error(f, "goes beyond the end of the file");
    f = file;
    f[0] = char(uint8_t(f[0]) + 8);
    expect_error(f, "the header is not valid JSON (a NUL byte at header offset");
    f = file;
    f[0] = char(uint8_t(f[0]) - 8);
    expect_error(f, "not valid JSON");
  }
  // Bad JSON, not an object, wrong dtype string, bad fields.
  {
    std::string f = file;
    f[8] = 'X';
    expect_error(f, "the header is not valid JSON");
    std::string data = file.substr(8 + n);
    expect_error(st_file("[1, 2]", data), "the header is not a JSON object");
    std::string h = file.substr(8, n);
    size_t at = h.find("\"F32\"");
    REQUIRE(at != std::string::npos);
    h.replace(at, 5, "\"Q32\"");
    expect_error(st_file(h, data), "unknown or unsupported dtype 'Q32'");
    expect_error(
        st_file(
            R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"U16","shape":[4],"data_offsets":[16,24]}})",
            data),
        "tensor 'b': unknown or unsupported dtype 'U16'");
    expect_error(st_file(R"({"a":{"dtype":"F32","shape":[4]}})", data), "needs 'dtype', 'shape' and 'data_offsets'");
    expect_error(st_file(R"({"a":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}})", data),
                 "not a non-negative integer");
    expect_error(st_file(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"__metadata__":{"k":1}})", data),
                 "'__metadata__' entry 'k' is not a string");
  }
  // Offsets out of range, overlapping, gaps; shape/size mismatch.
  {
    std::string data(24, '\0');
    expect_error(st_file(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,9999]}})", data),
                 "tensor 'a': data_offsets [0, 9999] are out of range");
    expect_error(st_file(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[16,0]}})", data), "end before they begin");
    expect_error(
        st_file(
            R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"I32","shape":[2],"data_offsets":[12,20]}})",
            data),
        "tensors 'a' [0, 16] and 'b' [12, 20] overlap");
    expect_error(
        st_file(
            R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"I16","shape":[2],"data_offsets":[20,24]}})",
            data),
        "bytes [16, 20) of the data section belong to no tensor");
    expect_error(st_file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,24]}})", data),
                 "shape (3,) of F32 needs 12 bytes but data_offsets [0, 24] span 24");
    expect_error(st_file(R"({"a":{"dtype":"F64","shape":[4611686018427387904, 4],"data_offsets":[0,24]}})", data),
                 "is too large");
  }
  // Names that cannot be nested.
  {
    std::string data(8, '\0');
    expect_error(
        st_file(
            R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a.b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
            data),
        "tensor 'a.b' needs 'a' to be a dict, but 'a' is itself a tensor");
    expect_error(
        st_file(
            R"({"x.0":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"x.y":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
            data),
        "mix integer and string keys under 'x'");
    expect_error(st_file(R"({"a..b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", data), "empty segment");
  }
  // A missing file.
  fs::path missing = tmp / "missing.safetensors";
  CHECK_THROWS_WITH_AS(io::load_safetensors(missing), doctest::Contains(missing.string().c_str()), IoError);
  CHECK_THROWS_WITH_AS(io::load_safetensors(missing), doctest::Contains("No such file"), IoError);
  CHECK_THROWS_WITH_AS(io::load_safetensors(tmp.dir), doctest::Contains("not a regular file"), IoError);
}

TEST_CASE("corrupt npy files raise IoError naming the file and the problem") {
  TmpDir tmp;
  fs::path good = tmp / "good.npy";
  io::save_npy(good, jnp::array<float>({1, 2, 3, 4, 5, 6}, {2, 3}));
  const std::string file = read_all(good);  // 128-byte header + 24 bytes
  REQUIRE(file.size() == 152);
  fs::path p = tmp / "bad.npy";
  auto expect_error = [&](const std::string& content, const std::string& problem) {
    CAPTURE(problem);
    write_all(p, content);
    CHECK_THROWS_WITH_AS(io::load_npy(p), doctest::Contains(p.string().c_str()), IoError);
    CHECK_THROWS_WITH_AS(io::load_npy(p), doctest::Contains(problem.c_str()), IoError);
  };
  expect_error("", "too few for an .npy header");
  expect_error(file.substr(0, 9), "too few for an .npy header");
  expect_error(file.substr(0, 60), "goes beyond the end of the file");
  expect_error(file.substr(0, 128),
               "truncated data: shape (2, 3) of <f4 needs 24 bytes after the header, the file has 0");
  expect_error(file.substr(0, 150), "truncated data");
  expect_error(file + "zz", "shape/size mismatch");
  std::string f = file;
  f[0] = 'X';
  expect_error(f, "the magic string");
  f = file;
  f[6] = 4;
  expect_error(f, "unsupported .npy format version 4.0");
  f = file;
  f[9] = 0x7f;
  expect_error(f, "goes beyond the end of the file");
  f = file;
  f.replace(f.find("'<f4'"), 5, "'<q4'");
  expect_error(f, "unsupported dtype '<q4'");
  f = file;
  f.replace(f.find("(2, 3)"), 6, "(2, x)");
  expect_error(f, "not a valid Python dict literal");
  f = file;
  f.replace(f.find("(2, 3)"), 6, "(3, 3)");
  expect_error(f, "truncated data: shape (3, 3)");
  f = file;
  f.replace(f.find("'fortran_order'"), 15, "'fortran_xrder'");
  expect_error(f, "unexpected key 'fortran_xrder'");
  fs::path missing = tmp / "missing.npy";
  CHECK_THROWS_WITH_AS(io::load_npy(missing), doctest::Contains(missing.string().c_str()), IoError);
}

namespace {
// Byte offset in `file` of tensor `name`'s data (from its safetensors header).
uint64_t data_offset(const std::string& file, const std::string& name) {
  uint64_t n = 0;
  for (int b = 0; b < 8; ++b) n |= uint64_t(uint8_t(file[size_t(b)])) << (8 * b);
  std::string h = file.substr(8, n), needle = "\"" + name + "\":{\"data_offsets\":[";
  size_t at = h.find(needle);
  REQUIRE(at != std::string::npos);
  return 8 + n + std::stoull(h.substr(at + needle.size()));
}
}  // namespace

TEST_CASE("safetensors checksums: stored per tensor, verified on load; files without them load") {
  TmpDir tmp;
  fs::path p = tmp / "ckpt.safetensors";
  Dict d;
  d["layers"][0]["w"] = jnp::array<float>({1, 2, 3, 4});
  d["layers"][1]["w"] = jnp::array<float>({5, 6, 7, 8});
  std::vector<uint8_t> ramp(1280);
  for (size_t i = 0; i < ramp.size(); ++i) ramp[i] = uint8_t(i);
  d["ramp"] = jnp::array<uint8_t>(ramp);
  d["none"] = jnp::array<float>(std::vector<float>{}, {0});
  io::save_safetensors(p, d, {{"step", "7"}});
  const std::string file = read_all(p);
  // The reference XXH3_64bits (seed 0) of each tensor's bytes (values from libxxhash / Python's xxhash).
  std::string header = file.substr(8, data_offset(file, "layers.0.w") - 8);
  CHECK(header.find(R"(\"layers.0.w\":\"a82f522ec4510db4\")") != std::string::npos);
  CHECK(header.find(R"(\"ramp\":\"4844b009e164352e\")") != std::string::npos);
  CHECK(header.find(R"(\"none\":\"2d06800538d394c2\")") != std::string::npos);
  // The checksums are cjax's: not part of the user's metadata, and a reserved key.
  CHECK(io::load_safetensors_metadata(p) == io::Metadata{{"step", "7"}});
  CHECK_THROWS_WITH_AS(io::save_safetensors(tmp / "x.safetensors", d, {{std::string(io::kChecksumKey), "{}"}}),
                       doctest::Contains("reserved"), ValueError);
  CHECK(io::load_safetensors(p)["layers"][1]["w"].array().to_vector<float>() == std::vector<float>{5, 6, 7, 8});

  SUBCASE("one flipped bit in a tensor's data is an IoError naming the tensor and the file") {
    for (const char* name : {"layers.1.w", "ramp"}) {
      CAPTURE(name);
      std::string bad = file;
      bad[data_offset(file, name) + 3] ^= 0x10;
      fs::path q = tmp / "flipped.safetensors";
      write_all(q, bad);
      std::string want = std::string("checksum mismatch in tensor '") + name + "'";
      CHECK_THROWS_WITH_AS(io::load_safetensors(q), doctest::Contains(want.c_str()), IoError);
      CHECK_THROWS_WITH_AS(io::load_safetensors_entries(q), doctest::Contains(want.c_str()), IoError);
      CHECK_THROWS_WITH_AS(io::load_safetensors(q), doctest::Contains(q.string().c_str()), IoError);
    }
  }
  SUBCASE("files without checksums (other writers) load; malformed checksum metadata is an IoError") {
    fs::path q = tmp / "plain.safetensors";
    std::string data = file.substr(data_offset(file, "layers.0.w"), 16);
    write_all(q, st_file(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", data));
    CHECK(io::load_safetensors(q)["a"].array().to_vector<float>() == std::vector<float>{1, 2, 3, 4});
    write_all(q, st_file(R"({"__metadata__":{"k":"v"},"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", data));
    CHECK(io::load_safetensors(q)["a"].array().to_vector<float>() == std::vector<float>{1, 2, 3, 4});
    CHECK(io::load_safetensors_metadata(q) == io::Metadata{{"k", "v"}});
    auto with_sums = [&](const std::string& sums) {
      std::string esc;
      for (char c : sums) esc += c == '"' ? std::string("\\\"") : std::string(1, c);
      return st_file(R"({"__metadata__":{"cjax.checksums.xxh3_64":")" + esc +
                         R"("},"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
                     data);
    };
    write_all(q, with_sums(R"({"a":"a82f522ec4510db4"})"));
    CHECK(io::load_safetensors(q)["a"].array().to_vector<float>() == std::vector<float>{1, 2, 3, 4});
    write_all(q, with_sums(R"({"a":"a82f522ec4510db5"})"));
    CHECK_THROWS_WITH_AS(io::load_safetensors(q), doctest::Contains("checksum mismatch in tensor 'a'"), IoError);
    write_all(q, with_sums(R"({"b":"a82f522ec4510db4"})"));
    CHECK_THROWS_WITH_AS(io::load_safetensors(q),
                         doctest::Contains("checksum for tensor 'b', which the file does not have"), IoError);
    write_all(q, with_sums(R"({"a":"xyz"})"));
    CHECK_THROWS_WITH_AS(io::load_safetensors(q), doctest::Contains("not 16 hex digits"), IoError);
    write_all(q, with_sums("[1]"));
    CHECK_THROWS_WITH_AS(io::load_safetensors(q), doctest::Contains("not a JSON object of checksums"), IoError);
  }
}

TEST_CASE("readers refuse a FIFO at once instead of waiting for a writer") {
  TmpDir tmp;
  fs::path fifo = tmp / "pipe.safetensors";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  // Should a reader block on the FIFO, this thread opens its write end after 3 s to release it, so
  // that the test fails on the elapsed time instead of hanging.
  std::atomic<bool> done{false};
  std::thread rescuer([&] {
    for (int i = 0; i < 30 && !done; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    while (!done) {
      int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);  // ENXIO while no reader waits
      if (fd >= 0) ::close(fd);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(io::load_safetensors(fifo), doctest::Contains("not a regular file (a FIFO)"), IoError);
  CHECK_THROWS_WITH_AS(io::load_safetensors_metadata(fifo), doctest::Contains(fifo.string().c_str()), IoError);
  CHECK_THROWS_WITH_AS(io::load_npy(fifo), doctest::Contains("not a regular file"), IoError);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  done = true;
  rescuer.join();
  CHECK(seconds < 2.0);
  CHECK_THROWS_WITH_AS(io::load_npy(tmp.dir), doctest::Contains("not a regular file (a directory)"), IoError);
}

TEST_CASE("temporaries: named .<name>.cjax-tmp.<pid>.<n>; those of dead processes are removed") {
  TmpDir tmp;
  fs::path p = tmp / "ckpt.safetensors";
  pid_t dead = ::fork();  // a pid that no longer exists: a child that has exited and been reaped
  if (dead == 0) ::_exit(0);
  REQUIRE(dead > 0);
  REQUIRE(::waitpid(dead, nullptr, 0) == dead);
  std::string stale = ".ckpt.safetensors.cjax-tmp." + std::to_string(dead) + ".0";
  std::string live = ".ckpt.safetensors.cjax-tmp." + std::to_string(::getppid()) + ".0";  // a live process's
  std::string own = ".ckpt.safetensors.cjax-tmp." + std::to_string(::getpid()) + ".5";    // maybe in progress
  std::string other = ".other.safetensors.cjax-tmp." + std::to_string(dead) + ".0";       // another target's
  std::string unlike = ".ckpt.safetensors.cjax-tmp." + std::to_string(dead) + ".0.bak";   // not the pattern
  for (const std::string& f : {stale, live, own, other, unlike}) write_all(tmp / f, "partial");
  CHECK(io::remove_stale_temporaries(p) == 1);
  CHECK(!fs::exists(tmp / stale));
  for (const std::string& f : {live, own, other, unlike}) CHECK(fs::exists(tmp / f));
  CHECK(io::remove_stale_temporaries(p) == 0);
  CHECK(io::remove_stale_temporaries(tmp / "no_such_dir" / "x.npy") == 0);

  SUBCASE("a write that fails after creating its temporary removes it") {
    Dict big;
    big["b"] = jnp::array<float>(std::vector<float>(100000, 2.f));
    auto prev = std::signal(SIGXFSZ, SIG_IGN);
    rlimit old_lim{};
    REQUIRE(getrlimit(RLIMIT_FSIZE, &old_lim) == 0);
    rlimit lim = old_lim;
    lim.rlim_cur = 4096;
    REQUIRE(setrlimit(RLIMIT_FSIZE, &lim) == 0);
    CHECK_THROWS_AS(io::save_safetensors(p, big), IoError);
    setrlimit(RLIMIT_FSIZE, &old_lim);
    std::signal(SIGXFSZ, prev);
    CHECK(tmp.count() == 4);  // live, own, other, unlike: nothing new
  }
}

TEST_CASE("sharded checkpoint: distinct blocks stored once, read onto other shardings, earlier saves removed") {
  TmpDir t;
  fs::path dir = t / "ckpt";
  Mesh x8 = make_mesh({8}, {"x"});
  Mesh grid = make_mesh({2, 4}, {"i", "j"});
  Array whole = jnp::arange(16 * 6).astype(DType::float32).reshape({16, 6});
  Array rows = device_put(whole, NamedSharding(x8, P("x")));  // 8 blocks
  Array replicated = device_put(whole.astype(DType::bfloat16), NamedSharding(grid, P(None, None)));
  Array on_one = jnp::arange(5).astype(DType::int32);
  Array scalar = Array(int32_t(7)).astype(DType::int32);
  std::vector<std::pair<std::string, Array>> leaves = {{"rows", rows},
                                                       {"cols",
                                                        device_put(whole * 2.0f, NamedSharding(grid, P("i", None)))},
                                                       {"replicated", replicated},
                                                       {"on_one", on_one},
                                                       {"scalar", scalar}};
  io::save_sharded_entries(dir, leaves, {{"step", "3"}});
  CHECK(fs::exists(dir / "index.json"));
  CHECK(fs::exists(dir / "process0.0.safetensors"));
  // Replicated leaves are stored once: 8 + 2 + 1 + 1 + 1 tensors.
  CHECK(io::load_safetensors_entries(dir / "process0.0.safetensors").size() == 13);
  CHECK(io::load_sharded_metadata(dir).at("step") == "3");
  std::vector<std::pair<std::string, AbstractValue>> index = io::load_sharded_index(dir);
  REQUIRE(index.size() == 5);
  CHECK(index[2].first == "replicated");
  CHECK(index[2].second.dtype == DType::bfloat16);
  CHECK(index[2].second.shape == Shape{16, 6});

  auto same = [](const Array& a, const Array& b) {
    return a.astype(DType::float32).to_vector<float>() == b.astype(DType::float32).to_vector<float>();
  };
  // Onto other layouts: each block assembled from the stored blocks that overlap it.
  Array r1 = io::load_sharded(dir, "rows", NamedSharding(grid, P("j", "i")));
  CHECK(r1.sharding().str() == NamedSharding(grid, P("j", "i")).str());
  CHECK(same(r1, whole));
  CHECK(same(io::load_sharded(dir, "rows", NamedSharding(grid, P())), whole));
  CHECK(same(io::load_sharded(dir, "cols", NamedSharding(x8, P("x"))), whole * 2.0f));
  CHECK(same(io::load_sharded(dir, "replicated", SingleDeviceSharding(devices()[3])), whole));
  CHECK(io::load_sharded(dir, "replicated", NamedSharding(x8, P("x"))).dtype() == DType::bfloat16);
  CHECK(same(io::load_sharded(dir, "on_one", NamedSharding(x8, P())), on_one));
  CHECK(io::load_sharded(dir, "scalar", SingleDeviceSharding(devices()[0])).item<int32_t>() == 7);
  CHECK_THROWS_WITH_AS(io::load_sharded(dir, "nope", NamedSharding(x8, P())), doctest::Contains("has no leaf 'nope'"),
                       IoError);

  // A second save into the directory replaces the first one's files once its index is written.
  io::save_sharded_entries(dir, {{"rows", rows}}, {});
  CHECK(fs::exists(dir / "process0.1.safetensors"));
  CHECK_FALSE(fs::exists(dir / "process0.0.safetensors"));
  CHECK(io::load_sharded_index(dir).size() == 1);
  // A flipped bit in a stored block is an IoError naming the tensor (the per-tensor checksums).
  std::string bytes_on_disk = read_all(dir / "process0.1.safetensors");
  bytes_on_disk[bytes_on_disk.size() - 3] ^= 0x10;
  write_all(dir / "process0.1.safetensors", bytes_on_disk);
  CHECK_THROWS_WITH_AS(io::load_sharded(dir, "rows", NamedSharding(x8, P())), doctest::Contains("checksum mismatch"),
                       IoError);
  CHECK_THROWS_WITH_AS(io::load_sharded_index(t / "empty"), doctest::Contains("no index.json"), IoError);
}
