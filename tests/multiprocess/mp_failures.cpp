// Failures of a multi-process run (cjax_launch -n 3, one CPU device each): a process that joins
// late, processes that run different collectives, a process that does not arrive, and one that
// dies. The survivors must raise CollectiveError naming the process at fault, never hang.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "cjax/cjax.h"
#include "cjax/distributed.h"

using namespace cjax;
namespace jnp = cjax::numpy;

namespace {
Array summed(const Mesh& m, bool max_on_last) {
  Array x = device_put(jnp::arange(6).astype(f32), NamedSharding(m, P("x")));
  Array out =
      jit(shard_map([&](const Array&
                            b) { return max_on_last && process_index() == 2 ? lax::pmax(b, "x") : lax::psum(b, "x"); },
                    m, P("x"), P()))(x);
  out.block_until_ready();  // a dispatched call's error is raised here
  return out;
}
bool g_process_died = false;
}  // namespace

TEST_CASE("a late joiner is waited for") {
  CHECK(process_count() == 3);
  Mesh m = make_mesh({3}, {"x"});
  CHECK(process_allgather(summed(m, false)).to_vector<float>() == std::vector<float>{6, 9});
}

TEST_CASE("processes that run different collectives are told so") {
  Mesh m = make_mesh({3}, {"x"});
  CHECK_THROWS_WITH_AS(summed(m, true), doctest::Contains("ran different operations"), CollectiveError);
}

TEST_CASE("a process that does not arrive is named after the timeout") {
  Mesh m(devices(), {3}, {"x"});
  Mesh reversed({devices()[2], devices()[1], devices()[0]}, {3}, {"x"});
  config::set_collective_timeout_seconds(2);
  if (process_index() == 2) {
    std::this_thread::sleep_for(std::chrono::seconds(5));  // misses the others' collective
    return;
  }
  auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(summed(reversed, false), doctest::Contains("process 2 did not arrive"), CollectiveError);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30));
}

TEST_CASE("a process that dies is named at once") {
  config::set_collective_timeout_seconds(60);
  Mesh m({devices()[1], devices()[2], devices()[0]}, {3}, {"x"});
  if (process_index() == 2) std::_Exit(0);  // dies without a word (exit code 0: the launcher lets it go)
  g_process_died = true;
  // Process 1 reaches the collective well after process 0 has failed in it and gone on to shut
  // down: the coordinator must still be there to name process 2.
  if (process_index() == 1) std::this_thread::sleep_for(std::chrono::seconds(1));
  auto t0 = std::chrono::steady_clock::now();
  std::string error;
  try {
    summed(m, false);
  } catch (const CollectiveError& e) {
    error = e.what();
  }
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20));
  CHECK_MESSAGE(error.find("process(es) 2 exited or crashed") != std::string::npos, error);
  // Found at the rendezvous, before connecting: process 1 must not connect to process 0's address
  // for a group that process 0 has given up on (that connect can wait forever).
  CHECK_MESSAGE(error.find("a process of the group left the coordinator") != std::string::npos, error);
}

int main(int argc, char** argv) {
  if (std::getenv("CJAX_PROCESS_ID") && std::string(std::getenv("CJAX_PROCESS_ID")) == "2")
    std::this_thread::sleep_for(std::chrono::seconds(2));  // the late joiner
  distributed::initialize();
  doctest::Context context(argc, argv);
  int rc = context.run();
  try {
    distributed::shutdown();
  } catch (const CollectiveError& e) {  // process 2 is gone: shutdown says so at once
    if (!g_process_died || std::string(e.what()).find("process 2") == std::string::npos) throw;
  }
  return rc;
}
