// The coordinator's key-value store (core/distributed/kv_store.h).
//
// Wire protocol: every message is a frame, a 4-byte big-endian payload length then the payload. A
// request's payload starts with its opcode, a reply's with a status byte (an error reply carries
// its message). Fields are big-endian integers and byte strings (a 4-byte length, then the bytes).
// A connection's first request is HELLO; the server answers requests in order, holding the reply
// to GET and BARRIER until it is decided, while the client waits for it in recv. The server runs
// one thread per connection, so one client's wait never holds up another's requests.
#include "core/distributed/kv_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <climits>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>

#include "cjax/errors.h"

namespace cjax::distributed {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr uint32_t kMagic = 0x434a4b56;  // "CJKV": tells a cjax coordinator from another server on the port
constexpr uint8_t kProtocolVersion = 1;
constexpr uint32_t kMaxFrameBytes = 256u << 20;
constexpr milliseconds kConnectRetryInterval{50};
// How much longer than a GET/BARRIER's own timeout a client waits for the reply, and how long it
// waits for the reply to any other request, before it calls the coordinator hung.
constexpr milliseconds kReplySlack{30'000};
constexpr milliseconds kGoodbyeReplyTimeout{5'000};
constexpr int kServerSendTimeoutSeconds = 10;  // a client that stops reading cannot block the server forever

enum class Op : uint8_t { hello = 1, set, get, check, add, barrier, dead_processes, joined_processes, goodbye };
enum class Status : uint8_t { ok = 0, collective_error = 1, value_error = 2 };

// A frame that does not follow the protocol: the server drops the connection, the client reports it.
struct ProtocolError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string errno_text(int error) { return std::system_category().message(error); }

std::string seconds_text(milliseconds duration) { return fmt::format("{:g}", double(duration.count()) / 1000.0); }

// now + duration + slack, saturating so that a huge timeout means "no deadline" instead of overflowing.
Clock::time_point deadline_after(milliseconds duration, milliseconds slack = milliseconds(0)) {
  constexpr milliseconds kForever = std::chrono::hours(24 * 365 * 100);
  if (duration >= kForever) return Clock::time_point::max();
  return Clock::now() + std::max(duration, milliseconds(0)) + slack;
}

int poll_timeout_ms(Clock::time_point deadline) {
  if (deadline == Clock::time_point::max()) return -1;
  int64_t left = std::chrono::ceil<milliseconds>(deadline - Clock::now()).count();
  return int(std::clamp<int64_t>(left, 0, INT_MAX));
}

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

void set_blocking(int fd, bool blocking) {
  int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags < 0) return;
  ::fcntl(fd, F_SETFL, blocking ? (flags & ~O_NONBLOCK) : (flags | O_NONBLOCK));
}

void set_no_delay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

UniqueFd tcp_socket() {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM, 0));
  if (fd.valid()) ::fcntl(fd.get(), F_SETFD, FD_CLOEXEC);
  return fd;
}

enum class IoResult { ok, closed, timed_out, stopped };

// Waits until `fd` is readable (or has hung up). `stop_fd`, when >= 0, ends the wait when readable.
IoResult wait_readable(int fd, int stop_fd, Clock::time_point deadline) {
  for (;;) {
    pollfd fds[2] = {{fd, POLLIN, 0}, {stop_fd, POLLIN, 0}};
    int ready = ::poll(fds, stop_fd >= 0 ? 2 : 1, poll_timeout_ms(deadline));
    if (ready < 0) {
      if (errno == EINTR) continue;
      return IoResult::closed;
    }
    if (ready == 0) return IoResult::timed_out;
    if (stop_fd >= 0 && fds[1].revents != 0) return IoResult::stopped;
    if (fds[0].revents != 0) return IoResult::ok;  // readable, hung up or failed: recv tells which
  }
}

IoResult recv_exact(int fd, char* data, size_t size, int stop_fd, Clock::time_point deadline) {
  size_t received = 0;
  while (received < size) {
    IoResult ready = wait_readable(fd, stop_fd, deadline);
    if (ready != IoResult::ok) return ready;
    ssize_t n = ::recv(fd, data + received, size - received, 0);
    if (n > 0) {
      received += size_t(n);
    } else if (n == 0) {
      return IoResult::closed;
    } else if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK) {
      return IoResult::closed;
    }
  }
  return IoResult::ok;
}

uint32_t load_u32(const char* bytes) {
  auto byte = [&](int i) { return uint32_t(static_cast<unsigned char>(bytes[i])); };
  return byte(0) << 24 | byte(1) << 16 | byte(2) << 8 | byte(3);
}

// Reads one frame's payload into `payload`; a length over kMaxFrameBytes counts as a broken connection.
IoResult recv_frame(int fd, int stop_fd, Clock::time_point deadline, std::vector<char>& payload) {
  char header[4];
  IoResult result = recv_exact(fd, header, sizeof(header), stop_fd, deadline);
  if (result != IoResult::ok) return result;
  uint32_t size = load_u32(header);
  if (size == 0 || size > kMaxFrameBytes) return IoResult::closed;
  payload.resize(size);
  return recv_exact(fd, payload.data(), size, stop_fd, deadline);
}

bool send_all(int fd, const std::vector<char>& bytes) {
  const char* data = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    ssize_t n = ::send(fd, data, left, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data += n;
    left -= size_t(n);
  }
  return true;
}

// Builds one frame: the length prefix, a tag (opcode or status), then the fields.
class FrameWriter {
 public:
  explicit FrameWriter(uint8_t tag) : bytes_(4) { u8(tag); }
  explicit FrameWriter(Op op) : FrameWriter(uint8_t(op)) {}
  explicit FrameWriter(Status status) : FrameWriter(uint8_t(status)) {}
  FrameWriter& u8(uint8_t value) {
    bytes_.push_back(char(value));
    return *this;
  }
  FrameWriter& u32(uint32_t value) {
    for (int shift = 24; shift >= 0; shift -= 8) bytes_.push_back(char((value >> shift) & 0xff));
    return *this;
  }
  FrameWriter& i64(int64_t value) {
    auto bits = uint64_t(value);
    for (int shift = 56; shift >= 0; shift -= 8) bytes_.push_back(char((bits >> shift) & 0xff));
    return *this;
  }
  FrameWriter& bytes(const char* data, size_t size) {
    u32(uint32_t(size));
    bytes_.insert(bytes_.end(), data, data + size);
    return *this;
  }
  FrameWriter& str(std::string_view text) { return bytes(text.data(), text.size()); }
  size_t payload_size() const { return bytes_.size() - 4; }
  std::vector<char> finish() {  // the last call: moves the bytes out
    auto size = uint32_t(payload_size());
    for (int i = 0; i < 4; ++i) bytes_[size_t(i)] = char((size >> (24 - 8 * i)) & 0xff);
    return std::move(bytes_);
  }

 private:
  std::vector<char> bytes_;
};

// Reads the fields of one payload; ProtocolError when it is shorter than its fields say.
class PayloadReader {
 public:
  explicit PayloadReader(const std::vector<char>& payload) : payload_(payload) {}
  uint8_t u8() { return static_cast<uint8_t>(*take(1)); }
  uint32_t u32() { return load_u32(take(4)); }
  int64_t i64() {
    uint64_t high = u32();
    return int64_t(high << 32 | u32());
  }
  std::string str() {
    uint32_t size = u32();
    const char* data = take(size);
    return std::string(data, size);
  }
  std::vector<char> blob() {
    uint32_t size = u32();
    const char* data = take(size);
    return std::vector<char>(data, data + size);
  }
  void expect_end() const {
    if (position_ != payload_.size()) throw ProtocolError("trailing bytes in a message");
  }

 private:
  const char* take(size_t size) {
    if (size > payload_.size() - position_) throw ProtocolError("truncated message");
    const char* data = payload_.data() + position_;
    position_ += size;
    return data;
  }
  const std::vector<char>& payload_;
  size_t position_ = 0;
};

std::vector<char> error_reply(Status status, const std::string& message) {
  return FrameWriter(status).str(message).finish();
}

std::vector<char> ids_reply(const std::set<int>& ids) {
  FrameWriter reply(Status::ok);
  reply.u32(uint32_t(ids.size()));
  for (int id : ids) reply.u32(uint32_t(id));
  return reply.finish();
}

// "process 3" or "processes 2, 3". (fmt::join trips a GCC 12 -O3 false positive inside fmt 9.)
std::string process_list_text(const std::vector<int>& ids) {
  std::string text = ids.size() == 1 ? "process" : "processes";
  for (size_t i = 0; i < ids.size(); ++i) text += (i == 0 ? " " : ", ") + std::to_string(ids[i]);
  return text;
}

// The IPv4 addresses of `host` (any address when empty and passive), or the resolver's reason.
struct Resolved {
  std::vector<sockaddr_in> addresses;
  std::string error;
};

Resolved resolve(const std::string& host, int port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* results = nullptr;
  std::string service = std::to_string(port);
  int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &results);
  Resolved resolved;
  if (rc != 0) {
    resolved.error =
        fmt::format("cannot resolve '{}': {}", host, rc == EAI_SYSTEM ? errno_text(errno) : gai_strerror(rc));
    return resolved;
  }
  for (addrinfo* entry = results; entry != nullptr; entry = entry->ai_next)
    if (entry->ai_family == AF_INET && entry->ai_addrlen == sizeof(sockaddr_in))
      resolved.addresses.push_back(*reinterpret_cast<const sockaddr_in*>(entry->ai_addr));
  ::freeaddrinfo(results);
  if (resolved.addresses.empty()) resolved.error = fmt::format("'{}' has no IPv4 address", host);
  return resolved;
}

// One non-blocking connect attempt that gives up at `deadline`; the connected socket, or the reason.
UniqueFd connect_once(const sockaddr_in& address, Clock::time_point deadline, std::string& error) {
  UniqueFd fd = tcp_socket();
  if (!fd.valid()) {
    error = errno_text(errno);
    return {};
  }
  set_blocking(fd.get(), false);
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0) {
    if (errno != EINPROGRESS && errno != EINTR) {
      error = errno_text(errno);
      return {};
    }
    for (;;) {
      pollfd writable{fd.get(), POLLOUT, 0};
      int ready = ::poll(&writable, 1, poll_timeout_ms(deadline));
      if (ready < 0 && errno == EINTR) continue;
      if (ready <= 0) {
        error = ready == 0 ? "no answer" : errno_text(errno);
        return {};
      }
      break;
    }
    int socket_error = 0;
    socklen_t length = sizeof(socket_error);
    ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &socket_error, &length);
    if (socket_error != 0) {
      error = errno_text(socket_error);
      return {};
    }
  }
  set_blocking(fd.get(), true);
  set_no_delay(fd.get());
  return fd;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Server

struct KvStoreServer::Impl {
  struct Connection {
    UniqueFd fd;
    std::thread thread;
    std::atomic<bool> finished{false};
  };
  // What the server knows about the client on one connection.
  struct Session {
    int process_id = -1;  // -1 until HELLO succeeds
    bool said_goodbye = false;
    bool rejected = false;  // HELLO refused: the connection ends after the reply
  };

  std::string host;
  int port = 0;
  int num_processes = 0;
  UniqueFd listen_fd;
  // Written once by the destructor and never read: stays readable, waking every poll() on it.
  UniqueFd stop_read, stop_write;
  std::thread accept_thread;

  std::mutex connections_mutex;
  std::vector<std::unique_ptr<Connection>> connections;

  std::mutex mutex;  // guards everything below
  std::condition_variable changed;
  bool stopping = false;
  std::map<std::string, std::vector<char>> values;
  std::map<std::string, std::set<int>> barrier_arrivals;
  std::set<int> joined, connected, dead;

  void accept_loop();
  void serve(Connection& connection);
  // The reply to one request, or nullopt to close the connection without one (the server is stopping).
  std::optional<std::vector<char>> handle(Session& session, const std::vector<char>& payload);
  std::vector<char> hello(Session& session, PayloadReader& request);
  std::optional<std::vector<char>> get(PayloadReader& request);
  std::vector<char> add(PayloadReader& request);
  std::optional<std::vector<char>> barrier(const Session& session, PayloadReader& request);
  void reap_finished_connections();
};

KvStoreServer::KvStoreServer(const std::string& host, int port, int num_processes) : impl_(std::make_unique<Impl>()) {
  if (num_processes < 1)
    throw ValueError(fmt::format("KvStoreServer: num_processes is {}; it must be at least 1", num_processes));
  if (port < 0 || port > 65535)
    throw ValueError(fmt::format("KvStoreServer: port {} is not in [0, 65535] (0 picks a free port)", port));
  impl_->host = host;
  impl_->num_processes = num_processes;
  auto cannot_listen = [&](const std::string& why) {
    return CollectiveError(
        fmt::format("the coordinator (process 0) could not listen on {}:{} ({}): check the port "
                    "of CJAX_COORDINATOR_ADDRESS",
                    host, port, why));
  };
  Resolved resolved = resolve(host, port, /*passive=*/true);
  if (!resolved.error.empty()) throw cannot_listen(resolved.error);
  UniqueFd fd = tcp_socket();
  if (!fd.valid()) throw cannot_listen(errno_text(errno));
  int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));  // restarts need not wait out TIME_WAIT
  const sockaddr_in& address = resolved.addresses.front();
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0 ||
      ::listen(fd.get(), SOMAXCONN) != 0)
    throw cannot_listen(errno_text(errno));
  sockaddr_in bound{};
  socklen_t length = sizeof(bound);
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &length) != 0)
    throw cannot_listen(errno_text(errno));
  impl_->port = ntohs(bound.sin_port);
  set_blocking(fd.get(), false);  // poll() may report a connection that is gone by the time accept() runs
  impl_->listen_fd = std::move(fd);

  int pipe_fds[2];
  if (::pipe(pipe_fds) != 0) throw cannot_listen(errno_text(errno));
  impl_->stop_read = UniqueFd(pipe_fds[0]);
  impl_->stop_write = UniqueFd(pipe_fds[1]);
  for (int pipe_fd : pipe_fds) ::fcntl(pipe_fd, F_SETFD, FD_CLOEXEC);
  impl_->accept_thread = std::thread([impl = impl_.get()] { impl->accept_loop(); });
}

KvStoreServer::~KvStoreServer() {
  {
    std::lock_guard lock(impl_->mutex);
    impl_->stopping = true;
  }
  impl_->changed.notify_all();
  char byte = 0;
  while (::write(impl_->stop_write.get(), &byte, 1) < 0 && errno == EINTR) {}
  impl_->accept_thread.join();
  // Replies already decided (a barrier that just completed) still go out before the sockets close.
  std::lock_guard lock(impl_->connections_mutex);
  for (auto& connection : impl_->connections) connection->thread.join();
  impl_->connections.clear();
}

int KvStoreServer::port() const { return impl_->port; }

void KvStoreServer::wait_for_others_to_leave(int self, std::chrono::milliseconds timeout) {
  std::unique_lock lock(impl_->mutex);
  impl_->changed.wait_until(lock, deadline_after(timeout), [&] {
    return std::all_of(impl_->connected.begin(), impl_->connected.end(), [&](int id) { return id == self; });
  });
}

void KvStoreServer::Impl::reap_finished_connections() {
  std::lock_guard lock(connections_mutex);
  auto finished_end = std::partition(connections.begin(), connections.end(),
                                     [](const std::unique_ptr<Connection>& c) { return !c->finished; });
  for (auto it = finished_end; it != connections.end(); ++it) (*it)->thread.join();
  connections.erase(finished_end, connections.end());
}

void KvStoreServer::Impl::accept_loop() {
  for (;;) {
    pollfd fds[2] = {{listen_fd.get(), POLLIN, 0}, {stop_read.get(), POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      std::this_thread::sleep_for(kConnectRetryInterval);
      continue;
    }
    if (fds[1].revents != 0) return;
    if (fds[0].revents == 0) continue;
    UniqueFd fd(::accept(listen_fd.get(), nullptr, nullptr));
    if (!fd.valid()) {
      // Out of descriptors (EMFILE) would make poll() report the listener at once forever: back off.
      if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK && errno != ECONNABORTED)
        std::this_thread::sleep_for(kConnectRetryInterval);
      continue;
    }
    ::fcntl(fd.get(), F_SETFD, FD_CLOEXEC);
    set_blocking(fd.get(), true);
    set_no_delay(fd.get());
    timeval send_timeout{kServerSendTimeoutSeconds, 0};
    ::setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &send_timeout, sizeof(send_timeout));
    reap_finished_connections();
    auto connection = std::make_unique<Connection>();
    connection->fd = std::move(fd);
    Connection& added = *connection;
    std::lock_guard lock(connections_mutex);
    connections.push_back(std::move(connection));
    try {
      added.thread = std::thread([this, &added] { serve(added); });
    } catch (const std::system_error&) {
      connections.pop_back();  // no thread to serve it: the client sees its connection close
    }
  }
}

void KvStoreServer::Impl::serve(Connection& connection) {
  Session session;
  std::vector<char> payload;
  for (;;) {
    if (recv_frame(connection.fd.get(), stop_read.get(), Clock::time_point::max(), payload) != IoResult::ok) break;
    std::optional<std::vector<char>> reply;
    try {
      reply = handle(session, payload);
    } catch (const ProtocolError&) {
      break;
    }
    if (!reply || !send_all(connection.fd.get(), *reply)) break;
    if (session.said_goodbye || session.rejected) break;
  }
  if (session.process_id >= 0 && !session.said_goodbye) {
    {
      std::lock_guard lock(mutex);
      connected.erase(session.process_id);
      dead.insert(session.process_id);
    }
    changed.notify_all();
  }
  // Closing here (not at reaping) lets the client see the end at once; the fd is not used after.
  connection.fd.reset();
  connection.finished = true;
}

std::optional<std::vector<char>> KvStoreServer::Impl::handle(Session& session, const std::vector<char>& payload) {
  PayloadReader request(payload);
  auto op = Op(request.u8());
  if (op == Op::hello) return hello(session, request);
  if (session.process_id < 0) throw ProtocolError("a request before HELLO");
  switch (op) {
    case Op::set: {
      std::string key = request.str();
      std::vector<char> value = request.blob();
      request.expect_end();
      {
        std::lock_guard lock(mutex);
        values[key] = std::move(value);
      }
      changed.notify_all();
      return FrameWriter(Status::ok).finish();
    }
    case Op::get: return get(request);
    case Op::check: {
      std::string key = request.str();
      request.expect_end();
      std::lock_guard lock(mutex);
      return FrameWriter(Status::ok).u8(values.count(key) != 0 ? 1 : 0).finish();
    }
    case Op::add: return add(request);
    case Op::barrier: return barrier(session, request);
    case Op::dead_processes: {
      request.expect_end();
      std::lock_guard lock(mutex);
      return ids_reply(dead);
    }
    case Op::joined_processes: {
      request.expect_end();
      std::lock_guard lock(mutex);
      return ids_reply(joined);
    }
    case Op::goodbye: {
      request.expect_end();
      session.said_goodbye = true;
      // Before the reply, so that the id is free to register again once the client's destructor returns.
      {
        std::lock_guard lock(mutex);
        connected.erase(session.process_id);
      }
      changed.notify_all();
      return FrameWriter(Status::ok).finish();
    }
    case Op::hello: break;
  }
  throw ProtocolError("unknown request");
}

std::vector<char> KvStoreServer::Impl::hello(Session& session, PayloadReader& request) {
  uint32_t magic = request.u32();
  uint8_t version = request.u8();
  auto process_id = int(request.u32());
  auto client_num_processes = int(request.u32());
  request.expect_end();
  if (magic != kMagic || version != kProtocolVersion || session.process_id >= 0)
    throw ProtocolError("not a cjax client of this protocol version");
  session.rejected = true;
  if (client_num_processes != num_processes)
    return error_reply(Status::collective_error,
                       fmt::format("process {} was started for {} processes but the coordinator (process 0) at {}:{} "
                                   "for {}: every process must be given the same CJAX_NUM_PROCESSES",
                                   process_id, client_num_processes, host, port, num_processes));
  if (process_id < 0 || process_id >= num_processes)
    return error_reply(Status::value_error, fmt::format("process id {} is not in [0, {}): check CJAX_PROCESS_ID",
                                                        process_id, num_processes));
  {
    std::lock_guard lock(mutex);
    if (connected.count(process_id) != 0)
      return error_reply(Status::collective_error,
                         fmt::format("process {0} joined twice (two processes were given CJAX_PROCESS_ID={0})",
                                     process_id));
    joined.insert(process_id);
    connected.insert(process_id);
    dead.erase(process_id);
  }
  session.rejected = false;
  session.process_id = process_id;
  changed.notify_all();
  return FrameWriter(Status::ok).finish();
}

std::optional<std::vector<char>> KvStoreServer::Impl::get(PayloadReader& request) {
  std::string key = request.str();
  auto timeout = milliseconds(request.i64());
  request.expect_end();
  Clock::time_point deadline = deadline_after(timeout);
  std::unique_lock lock(mutex);
  changed.wait_until(lock, deadline, [&] { return stopping || values.count(key) != 0; });
  if (auto found = values.find(key); found != values.end())
    return FrameWriter(Status::ok).bytes(found->second.data(), found->second.size()).finish();
  if (stopping) return std::nullopt;
  return error_reply(Status::collective_error,
                     fmt::format("timed out after {} s waiting for key '{}' in the coordinator's store: no process "
                                 "has set it",
                                 seconds_text(timeout), key));
}

std::vector<char> KvStoreServer::Impl::add(PayloadReader& request) {
  std::string key = request.str();
  int64_t delta = request.i64();
  request.expect_end();
  int64_t result = 0;
  {
    std::lock_guard lock(mutex);
    int64_t current = 0;
    if (auto found = values.find(key); found != values.end()) {
      const std::vector<char>& text = found->second;
      auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), current);
      if (text.empty() || error != std::errc() || end != text.data() + text.size())
        return error_reply(Status::value_error,
                           fmt::format("add('{}'): the key holds a value that is not a counter (set() wrote it; a "
                                       "counter is written only by add())",
                                       key));
    }
    if (__builtin_add_overflow(current, delta, &result))
      return error_reply(Status::value_error,
                         fmt::format("add('{}', {}): the counter {} would overflow int64", key, delta, current));
    std::string text = std::to_string(result);
    values[key] = std::vector<char>(text.begin(), text.end());
  }
  changed.notify_all();
  return FrameWriter(Status::ok).i64(result).finish();
}

std::optional<std::vector<char>> KvStoreServer::Impl::barrier(const Session& session, PayloadReader& request) {
  std::string name = request.str();
  auto timeout = milliseconds(request.i64());
  request.expect_end();
  Clock::time_point deadline = deadline_after(timeout);
  std::unique_lock lock(mutex);
  std::set<int>& arrived = barrier_arrivals[name];
  arrived.insert(session.process_id);
  changed.notify_all();
  auto missing = [&] {
    std::vector<int> ids;
    for (int id = 0; id < num_processes; ++id)
      if (arrived.count(id) == 0) ids.push_back(id);
    return ids;
  };
  auto missing_dead = [&] {
    std::vector<int> ids;
    for (int id : missing())
      if (dead.count(id) != 0) ids.push_back(id);
    return ids;
  };
  auto complete = [&] { return int(arrived.size()) == num_processes; };
  changed.wait_until(lock, deadline, [&] { return complete() || stopping || !missing_dead().empty(); });
  if (complete()) return FrameWriter(Status::ok).finish();
  if (std::vector<int> crashed = missing_dead(); !crashed.empty())
    return error_reply(Status::collective_error,
                       fmt::format("barrier '{}': {} disconnected from the coordinator ({} exited or crashed)", name,
                                   process_list_text(crashed), crashed.size() == 1 ? "it" : "they"));
  if (stopping) return std::nullopt;
  return error_reply(Status::collective_error, fmt::format("barrier '{}' timed out after {} s: {} did not arrive", name,
                                                           seconds_text(timeout), process_list_text(missing())));
}

// ---------------------------------------------------------------------------------------------
// Client

struct KvStoreClient::Impl {
  std::string address;  // "host:port" as given, for messages
  int process_id = 0;
  std::mutex mutex;  // one request at a time; guards everything below
  UniqueFd fd;
  bool connection_lost = false;

  CollectiveError lost_connection() const {
    return CollectiveError(
        fmt::format("lost the connection to the coordinator (process 0) at {}: it exited or crashed", address));
  }

  // Sends `frame` and returns the reply's payload after an ok status; raises the server's error,
  // or CollectiveError when the connection breaks or no reply comes by `reply_deadline`.
  std::vector<char> request(const std::vector<char>& frame, Clock::time_point reply_deadline) {
    if (connection_lost) throw lost_connection();
    std::vector<char> reply;
    IoResult result = send_all(fd.get(), frame) ? recv_frame(fd.get(), -1, reply_deadline, reply) : IoResult::closed;
    if (result != IoResult::ok) {
      connection_lost = true;  // the byte stream is out of step after a missed reply
      fd.reset();
      if (result == IoResult::timed_out)
        throw CollectiveError(
            fmt::format("the coordinator (process 0) at {} did not answer in time: it may be hung or overloaded",
                        address));
      throw lost_connection();
    }
    auto status = Status(static_cast<uint8_t>(reply[0]));
    if (status == Status::ok) return std::vector<char>(reply.begin() + 1, reply.end());
    std::string message;
    try {
      PayloadReader reader(reply);
      reader.u8();
      message = reader.str();
    } catch (const ProtocolError&) {
      message = fmt::format("the coordinator at {} sent a malformed error reply", address);
    }
    if (status == Status::value_error) throw ValueError(message);
    throw CollectiveError(message);
  }

  std::vector<char> request(const std::vector<char>& frame, milliseconds reply_timeout) {
    return request(frame, deadline_after(reply_timeout));
  }
};

namespace {
void check_timeout(milliseconds timeout, std::string_view method) {
  if (timeout.count() < 0)
    throw ValueError(fmt::format("KvStoreClient::{}: timeout is {} ms; it must be >= 0", method, timeout.count()));
}

// The reply's fields, checked to be exactly what the caller reads.
template <typename Read>
auto read_reply(const std::vector<char>& payload, const std::string& address, Read read) {
  try {
    PayloadReader reader(payload);
    auto value = read(reader);
    reader.expect_end();
    return value;
  } catch (const ProtocolError& e) {
    throw CollectiveError(fmt::format("malformed reply from the coordinator at {}: {}", address, e.what()));
  }
}

std::vector<int> read_ids(PayloadReader& reader) {
  std::vector<int> ids(reader.u32());
  for (int& id : ids) id = int(reader.u32());
  return ids;
}
}  // namespace

KvStoreClient::KvStoreClient(const std::string& address, int process_id, int num_processes,
                             milliseconds connect_timeout)
    : impl_(std::make_unique<Impl>()) {
  HostPort target = parse_coordinator_address(address);
  if (num_processes < 1)
    throw ValueError(fmt::format("KvStoreClient: num_processes is {}; it must be at least 1 (check CJAX_NUM_PROCESSES)",
                                 num_processes));
  if (process_id < 0 || process_id >= num_processes)
    throw ValueError(fmt::format("KvStoreClient: process id {} is not in [0, {}): check CJAX_PROCESS_ID", process_id,
                                 num_processes));
  check_timeout(connect_timeout, "KvStoreClient");
  impl_->address = address;
  impl_->process_id = process_id;

  Clock::time_point deadline = deadline_after(connect_timeout);
  std::string last_error;
  for (;;) {
    Resolved resolved = resolve(target.host, target.port, /*passive=*/false);
    last_error = resolved.error;
    for (const sockaddr_in& candidate : resolved.addresses) {
      impl_->fd = connect_once(candidate, deadline, last_error);
      if (impl_->fd.valid()) break;
    }
    if (impl_->fd.valid()) break;
    Clock::time_point now = Clock::now();
    if (now >= deadline)
      throw CollectiveError(
          fmt::format("could not reach the coordinator at {} within {} s ({}): check CJAX_COORDINATOR_ADDRESS and that "
                      "process 0 is running",
                      address, seconds_text(connect_timeout), last_error));
    std::this_thread::sleep_for(std::min<Clock::duration>(kConnectRetryInterval, deadline - now));
  }

  std::vector<char> hello = FrameWriter(Op::hello)
                                .u32(kMagic)
                                .u8(kProtocolVersion)
                                .u32(uint32_t(process_id))
                                .u32(uint32_t(num_processes))
                                .finish();
  std::lock_guard lock(impl_->mutex);
  impl_->request(hello, std::max(deadline, deadline_after(kGoodbyeReplyTimeout)));
}

KvStoreClient::~KvStoreClient() {
  std::lock_guard lock(impl_->mutex);
  if (impl_->connection_lost) return;
  try {
    impl_->request(FrameWriter(Op::goodbye).finish(), kGoodbyeReplyTimeout);
  } catch (const std::exception&) {
    // The coordinator is gone already: nothing to say goodbye to.
  }
}

void KvStoreClient::set(const std::string& key, const std::vector<char>& value) {
  FrameWriter frame(Op::set);
  frame.str(key).bytes(value.data(), value.size());
  if (frame.payload_size() > kMaxFrameBytes)
    throw ValueError(
        fmt::format("KvStoreClient::set('{}'): the value is {} bytes; the store holds at most {} per value", key,
                    value.size(), kMaxFrameBytes - key.size() - 9));
  std::lock_guard lock(impl_->mutex);
  impl_->request(frame.finish(), kReplySlack);
}

std::vector<char> KvStoreClient::get(const std::string& key, milliseconds timeout) {
  check_timeout(timeout, "get");
  std::lock_guard lock(impl_->mutex);
  std::vector<char> reply =
      impl_->request(FrameWriter(Op::get).str(key).i64(timeout.count()).finish(), deadline_after(timeout, kReplySlack));
  return read_reply(reply, impl_->address, [](PayloadReader& reader) { return reader.blob(); });
}

bool KvStoreClient::check(const std::string& key) {
  std::lock_guard lock(impl_->mutex);
  std::vector<char> reply = impl_->request(FrameWriter(Op::check).str(key).finish(), kReplySlack);
  return read_reply(reply, impl_->address, [](PayloadReader& reader) { return reader.u8() != 0; });
}

int64_t KvStoreClient::add(const std::string& key, int64_t delta) {
  std::lock_guard lock(impl_->mutex);
  std::vector<char> reply = impl_->request(FrameWriter(Op::add).str(key).i64(delta).finish(), kReplySlack);
  return read_reply(reply, impl_->address, [](PayloadReader& reader) { return reader.i64(); });
}

void KvStoreClient::barrier(const std::string& name, milliseconds timeout) {
  check_timeout(timeout, "barrier");
  std::lock_guard lock(impl_->mutex);
  std::vector<char> reply = impl_->request(FrameWriter(Op::barrier).str(name).i64(timeout.count()).finish(),
                                           deadline_after(timeout, kReplySlack));
  read_reply(reply, impl_->address, [](PayloadReader&) { return 0; });
}

std::vector<int> KvStoreClient::dead_processes() {
  std::lock_guard lock(impl_->mutex);
  std::vector<char> reply = impl_->request(FrameWriter(Op::dead_processes).finish(), kReplySlack);
  return read_reply(reply, impl_->address, read_ids);
}

std::vector<int> KvStoreClient::joined_processes() {
  std::lock_guard lock(impl_->mutex);
  std::vector<char> reply = impl_->request(FrameWriter(Op::joined_processes).finish(), kReplySlack);
  return read_reply(reply, impl_->address, read_ids);
}

int KvStoreClient::process_id() const { return impl_->process_id; }

// "host:port" → its parts; ValueError naming the address when it is not that.
HostPort parse_coordinator_address(const std::string& address) {
  auto malformed = [&](std::string_view why) {
    return ValueError(
        fmt::format("malformed coordinator address '{}': {}; expected host:port such as 127.0.0.1:1234 (check "
                    "CJAX_COORDINATOR_ADDRESS)",
                    address, why));
  };
  size_t colon = address.find(':');
  if (colon == std::string::npos) throw malformed("no ':PORT'");
  if (address.find(':', colon + 1) != std::string::npos) throw malformed("more than one ':'");
  HostPort parsed{address.substr(0, colon), 0};
  std::string_view port_text = std::string_view(address).substr(colon + 1);
  if (parsed.host.empty()) throw malformed("no host before ':'");
  auto [end, error] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), parsed.port);
  if (port_text.empty() || error != std::errc() || end != port_text.data() + port_text.size() || parsed.port < 1 ||
      parsed.port > 65535)
    throw malformed(fmt::format("port '{}' is not a number in [1, 65535]", port_text));
  return parsed;
}

}  // namespace cjax::distributed
