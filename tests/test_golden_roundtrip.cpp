// Every golden jaxpr text in the test suites round-trips through the parser: the texts compared
// with `==` in tests/test_*.cpp are read from the sources, parsed, checked with check_jaxpr and
// printed again, which must give the same text.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "cjax/cjax.h"
#include "test_util.h"
#include "trace/eval_jaxpr.h"
#include "trace/jaxpr.h"
#include "trace/jaxpr_parser.h"

using namespace cjax;
namespace fs = std::filesystem;

namespace {

struct Golden {
  std::string file;
  int line;
  std::string text;
};

// The value of a run of adjacent C++ string literals starting at s[i] (which is '"').
std::string read_literals(const std::string& s, size_t& i) {
  std::string out;
  while (i < s.size() && s[i] == '"') {
    ++i;
    while (i < s.size() && s[i] != '"') {
      if (s[i] == '\\' && i + 1 < s.size()) {
        char c = s[++i];
        out += c == 'n' ? '\n' : c == 't' ? '\t' : c;
      } else {
        out += s[i];
      }
      ++i;
    }
    ++i;  // closing quote
    size_t j = i;
    while (j < s.size() && std::isspace(static_cast<unsigned char>(s[j]))) ++j;
    if (j < s.size() && s[j] == '"')
      i = j;
    else
      break;
  }
  return out;
}

std::vector<Golden> goldens() {
  std::vector<Golden> out;
  fs::path dir = fs::path(CJAX_TEST_DATA_DIR).parent_path();
  for (const auto& entry : fs::directory_iterator(dir)) {
    std::string name = entry.path().filename().string();
    if (name.rfind("test_", 0) != 0 || entry.path().extension() != ".cpp") continue;
    std::ifstream in(entry.path());
    std::stringstream ss;
    ss << in.rdbuf();
    std::string s = ss.str();
    for (size_t pos = s.find("=="); pos != std::string::npos; pos = s.find("==", pos + 2)) {
      size_t i = pos + 2;
      while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
      if (i >= s.size() || s[i] != '"') continue;
      int line = 1 + int(std::count(s.begin(), s.begin() + std::ptrdiff_t(i), '\n'));
      std::string text = read_literals(s, i);
      if (text.rfind("{ lambda", 0) == 0) out.push_back({name, line, text});
    }
  }
  return out;
}

}  // namespace

TEST_CASE("every golden jaxpr text parses back and prints identically") {
  std::vector<Golden> all = goldens();
  CHECK(all.size() >= 30);
  int parsed = 0;
  std::vector<std::string> test_only;
  for (const Golden& g : all) {
    CAPTURE(g.file);
    CAPTURE(g.line);
    std::shared_ptr<const Jaxpr> j;
    try {
      j = parse_jaxpr(g.text);
    } catch (const ValueError& e) {
      // Primitives registered by a test binary itself (e.g. test_call) are unknown here.
      std::string w = e.what();
      if (w.find("unknown primitive 'test_") != std::string::npos ||
          w.find("unknown primitive 'parser_test_") != std::string::npos) {
        test_only.push_back(g.file + ":" + std::to_string(g.line));
        continue;
      }
      FAIL_CHECK(w);
      continue;
    }
    ++parsed;
    CHECK(j->pretty_print() == g.text);
    check_jaxpr(*j);
  }
  MESSAGE(parsed << " golden texts round-trip; " << test_only.size() << " use test-only primitives");
  CHECK(test_only.size() <= 6);
  CHECK(parsed >= 30);
}
