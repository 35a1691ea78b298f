// The coordinator's key-value store (core/distributed/kv_store.h): a server on a free port of
// 127.0.0.1, clients on threads standing in for processes, and forked children standing in for
// processes that crash (they register, then _exit without saying goodbye).
#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "cjax/errors.h"
#include "core/distributed/kv_store.h"
#include "test_util.h"

using cjax::testing::on_threads;

using cjax::CollectiveError;
using cjax::ValueError;
using cjax::distributed::KvStoreClient;
using cjax::distributed::KvStoreServer;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

std::string address_of(const KvStoreServer& server) { return "127.0.0.1:" + std::to_string(server.port()); }

std::vector<char> bytes(std::string_view text) { return {text.begin(), text.end()}; }
std::string text(const std::vector<char>& value) { return {value.begin(), value.end()}; }

bool contains(const std::string& haystack, std::string_view needle) {
  return haystack.find(needle) != std::string::npos;
}

// The message of the ErrorType that `body` raises ("" with a test failure when it raises none).
template <typename ErrorType>
std::string message_of(const std::function<void()>& body) {
  try {
    body();
  } catch (const ErrorType& e) {
    return e.what();
  }
  FAIL("expected an exception");
  return "";
}

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// Forks a process that registers `process_id`, waits `linger`, then exits without saying goodbye, as
// a crash would. Returns its pid; reap it with expect_clean_exit.
pid_t fork_crashing_client(const std::string& address, int process_id, int num_processes,
                           std::chrono::milliseconds linger = 0ms) {
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    try {
      KvStoreClient client(address, process_id, num_processes, 2000ms);
      std::this_thread::sleep_for(linger);
      ::_exit(0);  // skips the destructor's goodbye
    } catch (...) {
      ::_exit(1);
    }
  }
  return pid;
}

void expect_clean_exit(pid_t pid) {
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

// Polls the store until `condition` holds (the server notices a closed connection asynchronously).
bool eventually(const std::function<bool()>& condition, std::chrono::milliseconds timeout = 2000ms) {
  Clock::time_point deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return condition();
}

// A port of 127.0.0.1 bound but not listening while it lives: connecting there is refused, and no
// other program can take the port meanwhile. SO_REUSEADDR lets a KvStoreServer bind it too.
class ReservedPort {
 public:
  ReservedPort() : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    REQUIRE(fd_ >= 0);
    int one = 1;
    ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(address);
    REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0);
    REQUIRE(::getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length) == 0);
    port_ = ntohs(address.sin_port);
  }
  ReservedPort(const ReservedPort&) = delete;
  ReservedPort& operator=(const ReservedPort&) = delete;
  ~ReservedPort() { ::close(fd_); }
  int port() const { return port_; }

 private:
  int fd_;
  int port_ = 0;
};

}  // namespace

TEST_CASE("kv_store: a value set by one client is read by another") {
  KvStoreServer server("127.0.0.1", 0, 2);
  CHECK(server.port() > 0);
  on_threads(2, [&](int process) {
    KvStoreClient client(address_of(server), process, 2, 2000ms);
    CHECK(client.process_id() == process);
    if (process == 0) {
      client.set("greeting", bytes("hello"));
      client.set("empty", {});
    } else {
      CHECK(text(client.get("greeting", 2000ms)) == "hello");
      CHECK(client.get("empty", 2000ms).empty());
      CHECK(client.check("greeting"));
      CHECK_FALSE(client.check("absent"));
    }
  });
  KvStoreClient late(address_of(server), 0, 2, 2000ms);
  CHECK(late.joined_processes() == std::vector<int>{0, 1});
  CHECK(late.dead_processes().empty());  // both said goodbye
  std::vector<char> binary = {'\0', '\xff', 'a', '\0'};
  late.set("greeting", binary);  // overwrites
  CHECK(late.get("greeting", 0ms) == binary);
}

TEST_CASE("kv_store: get blocks until another client sets the key, and one client serves several threads") {
  KvStoreServer server("127.0.0.1", 0, 2);
  KvStoreClient reader(address_of(server), 0, 2, 2000ms);
  KvStoreClient writer(address_of(server), 1, 2, 2000ms);
  Clock::time_point start = Clock::now();
  std::thread setter([&] {
    std::this_thread::sleep_for(150ms);
    writer.set("late", bytes("now"));
  });
  CHECK(text(reader.get("late", 3000ms)) == "now");
  CHECK(seconds_since(start) >= 0.14);
  setter.join();

  on_threads(4, [&](int t) {
    for (int i = 0; i < 20; ++i) {
      std::string key = "thread" + std::to_string(t) + "/" + std::to_string(i);
      writer.set(key, bytes(key));
      CHECK(text(writer.get(key, 1000ms)) == key);
    }
  });
}

TEST_CASE("kv_store: get times out with a CollectiveError naming the key") {
  KvStoreServer server("127.0.0.1", 0, 1);
  KvStoreClient client(address_of(server), 0, 1, 2000ms);
  Clock::time_point start = Clock::now();
  std::string message = message_of<CollectiveError>([&] { client.get("never/set", 200ms); });
  double waited = seconds_since(start);
  CHECK(contains(message, "'never/set'"));
  CHECK(contains(message, "0.2 s"));
  CHECK(waited >= 0.19);
  CHECK(waited < 1.5);
  client.set("after", bytes("x"));  // the client still works
  CHECK(client.check("after"));
}

TEST_CASE("kv_store: add is an atomic counter") {
  KvStoreServer server("127.0.0.1", 0, 3);
  on_threads(3, [&](int process) {
    KvStoreClient client(address_of(server), process, 3, 2000ms);
    for (int i = 0; i < 10; ++i) client.add("count", 1);
  });
  KvStoreClient client(address_of(server), 0, 3, 2000ms);
  CHECK(client.add("count", 0) == 30);
  CHECK(client.add("count", -5) == 25);
  CHECK(text(client.get("count", 0ms)) == "25");
  CHECK(client.add("fresh", 7) == 7);
  client.set("words", bytes("not a number"));
  CHECK(contains(message_of<ValueError>([&] { client.add("words", 1); }), "'words'"));
}

TEST_CASE("kv_store: a barrier of three clients returns once all arrived") {
  KvStoreServer server("127.0.0.1", 0, 3);
  std::atomic<int> arrived{0};
  on_threads(3, [&](int process) {
    KvStoreClient client(address_of(server), process, 3, 2000ms);
    std::this_thread::sleep_for(std::chrono::milliseconds(40 * process));  // arrive at different times
    client.set("before/" + std::to_string(process), bytes("x"));
    ++arrived;
    client.barrier("sync", 3000ms);
    CHECK(arrived.load() == 3);
    for (int other = 0; other < 3; ++other) CHECK(client.check("before/" + std::to_string(other)));
    client.barrier("sync", 100ms);  // a completed barrier returns at once
  });
}

TEST_CASE("kv_store: a barrier that times out names exactly the processes that did not arrive") {
  KvStoreServer server("127.0.0.1", 0, 4);
  KvStoreClient idle(address_of(server), 2, 4, 2000ms);  // joined but never arrives; process 3 never joins
  Clock::time_point start = Clock::now();
  on_threads(2, [&](int process) {
    KvStoreClient client(address_of(server), process, 4, 2000ms);
    std::string message = message_of<CollectiveError>([&] { client.barrier("step", 300ms); });
    CHECK(message == "barrier 'step' timed out after 0.3 s: processes 2, 3 did not arrive");
  });
  CHECK(seconds_since(start) < 2.0);
  KvStoreServer one("127.0.0.1", 0, 2);
  KvStoreClient first(address_of(one), 0, 2, 2000ms);
  CHECK(message_of<CollectiveError>([&] { first.barrier("alone", 50ms); }) ==
        "barrier 'alone' timed out after 0.05 s: process 1 did not arrive");
}

TEST_CASE("kv_store: a process that exits without goodbye is dead, and a barrier waiting for it fails at once") {
  KvStoreServer server("127.0.0.1", 0, 3);
  KvStoreClient client(address_of(server), 0, 3, 2000ms);
  { KvStoreClient polite(address_of(server), 1, 3, 2000ms); }
  expect_clean_exit(fork_crashing_client(address_of(server), 2, 3));
  REQUIRE(eventually([&] { return client.dead_processes() == std::vector<int>{2}; }));
  CHECK(client.joined_processes() == std::vector<int>{0, 1, 2});

  Clock::time_point start = Clock::now();
  std::string message = message_of<CollectiveError>([&] { client.barrier("after-crash", 5000ms); });
  CHECK(message == "barrier 'after-crash': process 2 disconnected from the coordinator (it exited or crashed)");
  CHECK(seconds_since(start) < 1.0);

  // A restarted process 2 registers again and is no longer dead.
  KvStoreClient restarted(address_of(server), 2, 3, 2000ms);
  CHECK(client.dead_processes().empty());
}

TEST_CASE("kv_store: a barrier already waiting fails as soon as a missing process crashes") {
  KvStoreServer server("127.0.0.1", 0, 2);
  KvStoreClient client(address_of(server), 0, 2, 2000ms);
  pid_t child = fork_crashing_client(address_of(server), 1, 2, 150ms);
  Clock::time_point start = Clock::now();
  std::string message = message_of<CollectiveError>([&] { client.barrier("waiting", 5000ms); });
  expect_clean_exit(child);
  CHECK(message == "barrier 'waiting': process 1 disconnected from the coordinator (it exited or crashed)");
  CHECK(seconds_since(start) < 2.0);
}

TEST_CASE("kv_store: a client waiting on a coordinator that goes away raises instead of hanging") {
  SUBCASE("the server is destroyed") {
    auto server = std::make_unique<KvStoreServer>("127.0.0.1", 0, 2);
    std::string address = address_of(*server);
    KvStoreClient waiter(address, 1, 2, 2000ms);
    KvStoreClient idle(address, 0, 2, 2000ms);
    std::thread stopper([&] {
      std::this_thread::sleep_for(100ms);
      server.reset();
    });
    Clock::time_point start = Clock::now();
    std::string message = message_of<CollectiveError>([&] { waiter.get("never", 5000ms); });
    stopper.join();
    CHECK(message == "lost the connection to the coordinator (process 0) at " + address + ": it exited or crashed");
    CHECK(seconds_since(start) < 2.0);
    CHECK(message_of<CollectiveError>([&] { idle.set("k", {}); }) == message);
    CHECK(message_of<CollectiveError>([&] { waiter.check("k"); }) == message);
  }
  SUBCASE("the server's process is killed") {
    int port_pipe[2];
    REQUIRE(::pipe(port_pipe) == 0);
    pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      KvStoreServer server("127.0.0.1", 0, 1);
      int port = server.port();
      if (::write(port_pipe[1], &port, sizeof(port)) != sizeof(port)) ::_exit(1);
      for (;;) ::pause();
    }
    int port = 0;
    REQUIRE(::read(port_pipe[0], &port, sizeof(port)) == sizeof(port));
    ::close(port_pipe[0]);
    ::close(port_pipe[1]);
    KvStoreClient waiter("127.0.0.1:" + std::to_string(port), 0, 1, 2000ms);
    std::thread killer([&] {
      std::this_thread::sleep_for(100ms);
      ::kill(child, SIGKILL);
    });
    Clock::time_point start = Clock::now();
    std::string message = message_of<CollectiveError>([&] { waiter.get("never", 5000ms); });
    killer.join();
    ::waitpid(child, nullptr, 0);
    CHECK(contains(message, "lost the connection to the coordinator (process 0)"));
    CHECK(seconds_since(start) < 2.0);
  }
}

TEST_CASE("kv_store: connecting where no coordinator listens fails within the timeout") {
  ReservedPort nobody_listens;
  Clock::time_point start = Clock::now();
  std::string address = "127.0.0.1:" + std::to_string(nobody_listens.port());
  std::string message = message_of<CollectiveError>([&] { KvStoreClient client(address, 0, 1, 300ms); });
  double waited = seconds_since(start);
  CHECK(waited >= 0.29);
  CHECK(waited < 1.5);
  CHECK(contains(message, "could not reach the coordinator at " + address + " within 0.3 s ("));
  CHECK(contains(message, "CJAX_COORDINATOR_ADDRESS"));
}

TEST_CASE("kv_store: a client started before the coordinator waits for it") {
  ReservedPort reserved;
  int port = reserved.port();
  std::unique_ptr<KvStoreServer> server;
  std::thread starter([&] {
    std::this_thread::sleep_for(150ms);
    server = std::make_unique<KvStoreServer>("127.0.0.1", port, 1);
  });
  KvStoreClient client("127.0.0.1:" + std::to_string(port), 0, 1, 3000ms);
  starter.join();
  client.set("k", bytes("v"));
  CHECK(text(client.get("k", 0ms)) == "v");
}

TEST_CASE("kv_store: configuration mistakes are named") {
  KvStoreServer server("127.0.0.1", 0, 2);
  std::string address = address_of(server);
  for (std::string bad : {"nohost", "h:1:2", "h:port", ":123", "h:", "h:70000", "h:0", "h:12x"}) {
    CAPTURE(bad);
    CHECK(contains(message_of<ValueError>([&] { KvStoreClient client(bad, 0, 2, 100ms); }), "'" + bad + "'"));
  }
  CHECK(contains(message_of<ValueError>([&] { KvStoreClient client(address, 2, 2, 100ms); }), "process id 2"));
  CHECK(contains(message_of<ValueError>([&] { KvStoreClient client(address, -1, 2, 100ms); }), "process id -1"));

  std::string mismatch = message_of<CollectiveError>([&] { KvStoreClient client(address, 0, 3, 2000ms); });
  CHECK(contains(mismatch, "3 processes"));
  CHECK(contains(mismatch, "for 2"));
  CHECK(contains(mismatch, "CJAX_NUM_PROCESSES"));

  {
    KvStoreClient first(address, 1, 2, 2000ms);
    CHECK(message_of<CollectiveError>([&] { KvStoreClient second(address, 1, 2, 2000ms); }) ==
          "process 1 joined twice (two processes were given CJAX_PROCESS_ID=1)");
    CHECK(first.joined_processes() == std::vector<int>{1});
  }
  KvStoreClient again(address, 1, 2, 2000ms);  // free once the first said goodbye
  CHECK(again.dead_processes().empty());

  std::string taken = message_of<CollectiveError>([&] { KvStoreServer second("127.0.0.1", server.port(), 2); });
  CHECK(contains(taken, address));
  CHECK(contains(taken, "Address already in use"));
  CHECK_THROWS_AS(KvStoreServer("127.0.0.1", 0, 0), ValueError);
  CHECK_THROWS_AS(KvStoreServer("127.0.0.1", 70000, 1), ValueError);
}

TEST_CASE("kv_store: a barrier's replies still arrive when process 0 stops the server right after it") {
  for (int round = 0; round < 20; ++round) {
    auto server = std::make_unique<KvStoreServer>("127.0.0.1", 0, 3);
    std::string address = address_of(*server);
    on_threads(3, [&](int process) {
      KvStoreClient client(address, process, 3, 2000ms);
      client.barrier("shutdown", 2000ms);
      if (process == 0) server.reset();  // as distributed::shutdown does; the other clients' goodbyes go unanswered
    });
  }
}
