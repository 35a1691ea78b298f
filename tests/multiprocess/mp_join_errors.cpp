// distributed::initialize's errors, in one process: a process that never joins, a coordinator
// that is not there, malformed settings, and initialize after the runtime started.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>

#include "cjax/cjax.h"
#include "cjax/distributed.h"

using namespace cjax;

namespace {
int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}
std::string local_address() { return fmt::format("127.0.0.1:{}", free_port()); }
}  // namespace

TEST_CASE("initialize names the processes that never joined") {
  auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(distributed::initialize({.coordinator_address = local_address(),
                                                .num_processes = 3,
                                                .process_id = 0,
                                                .initialization_timeout_s = 1}),
                       doctest::Contains("processes 1, 2 did not arrive"), CollectiveError);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
  CHECK_FALSE(distributed::is_initialized());
}

TEST_CASE("a wrong coordinator address is a clear error") {
  CHECK_THROWS_WITH_AS(distributed::initialize({.coordinator_address = local_address(),
                                                .num_processes = 2,
                                                .process_id = 1,
                                                .initialization_timeout_s = 0.5}),
                       doctest::Contains("CJAX_COORDINATOR_ADDRESS"), CollectiveError);
  CHECK_THROWS_WITH_AS(distributed::initialize({.coordinator_address = "nohost", .num_processes = 2, .process_id = 1}),
                       doctest::Contains("host:port"), ValueError);
  CHECK_THROWS_WITH_AS(distributed::initialize(
                           {.coordinator_address = "127.0.0.1:1234", .num_processes = 2, .process_id = 2}),
                       doctest::Contains("process id 2 is not in [0, 2)"), ValueError);
}

TEST_CASE("one process without initialize, and initialize after the runtime started") {
  CHECK(process_index() == 0);
  CHECK(process_count() == 1);
  CHECK(devices().size() == local_devices().size());
  Array x = numpy::ones({2});
  CHECK(is_fully_addressable(x));
  CHECK(process_allgather(x).to_vector<float>() == std::vector<float>{1, 1});
  CHECK_THROWS_WITH_AS(distributed::initialize(
                           {.coordinator_address = local_address(), .num_processes = 1, .process_id = 0}),
                       doctest::Contains("before the first array"), BackendError);
}
