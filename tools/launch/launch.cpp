// cjax_launch: starts a multi-process cjax run on this machine (include/cjax/distributed.h).
//
//   cjax_launch -n N [--devices-per-process K] [--timeout SECONDS] -- program args...
//
// It picks a free TCP port on 127.0.0.1 for the coordinator and starts N copies of the program,
// process k with CJAX_COORDINATOR_ADDRESS=127.0.0.1:PORT, CJAX_NUM_PROCESSES=N, CJAX_PROCESS_ID=k
// and, with --devices-per-process, CJAX_NUM_CPU_DEVICES=K; their standard input is /dev/null.
// Every line a process writes comes out prefixed "[process k] ", its stdout on the launcher's
// stdout and its stderr on the launcher's stderr; the launcher's own messages ("[launch] ...") go
// to stderr.
//
// The first process to fail (a non-zero exit or a signal) stops the run: the others get SIGTERM,
// SIGKILL 3 s later, and the launcher exits with the failed process's code (128 + the signal's
// number for a signal); 0 when every process exits 0. --timeout stops every process the same way
// after that many seconds and exits 124. SIGINT and SIGTERM sent to the launcher are passed on to
// every process (a second one kills them), and it then exits 128 + that signal's number. Each
// process leads its own process group, so whatever it started itself is signalled with it.
#include <fcntl.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

constexpr std::string_view kUsage =
    "usage: cjax_launch -n N [--devices-per-process K] [--timeout SECONDS] -- program [args...]\n"
    "  -n N                       start N processes (CJAX_NUM_PROCESSES=N, CJAX_PROCESS_ID=0..N-1)\n"
    "  --devices-per-process K    give each process K CPU devices (CJAX_NUM_CPU_DEVICES=K)\n"
    "  --timeout SECONDS          stop every process after SECONDS and exit 124 (default: no limit)\n";
constexpr auto kGraceBeforeKill = std::chrono::seconds(3);
// How long output pipes may stay open after every process exited (something they started in the
// background still holds them) before the launcher stops reading and exits.
constexpr auto kDrainAfterExit = std::chrono::seconds(1);
constexpr size_t kMaxLineBytes = 64 * 1024;  // a longer line without '\n' comes out in pieces

struct Options {
  int num_processes = 0;
  int devices_per_process = 0;  // 0: leave CJAX_NUM_CPU_DEVICES as it is
  std::optional<double> timeout_s;
  std::vector<std::string> command;
};

[[noreturn]] void usage_error(const std::string& why) {
  fmt::print(stderr, "cjax_launch: {}\n{}", why, kUsage);
  std::exit(2);
}

int parse_positive_int(std::string_view option, std::string_view text) {
  int value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size() || value < 1)
    usage_error(fmt::format("{} expects a positive integer, not '{}'", option, text));
  return value;
}

double parse_seconds(std::string_view option, const std::string& text) {
  char* end = nullptr;
  double value = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !std::isfinite(value) || value <= 0)
    usage_error(fmt::format("{} expects a positive number of seconds, not '{}'", option, text));
  return value;
}

Options parse_options(int argc, char** argv) {
  Options options;
  int i = 1;
  // Whether argv[i] is option `name`, given as "NAME VALUE", "NAME=VALUE" or (-n only) "-nVALUE".
  auto is = [&](std::string_view name) {
    std::string_view arg = argv[i];
    if (!arg.starts_with(name)) return false;
    return arg.size() == name.size() || arg[name.size()] == '=' || name == "-n";
  };
  auto value_of = [&](std::string_view name) -> std::string {
    std::string_view arg = argv[i];
    if (arg.size() > name.size())
      return std::string(arg.substr(arg[name.size()] == '=' ? name.size() + 1 : name.size()));
    if (i + 1 >= argc) usage_error(fmt::format("{} needs a value", name));
    return argv[++i];
  };
  for (; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg == "-h" || arg == "--help") {
      fmt::print("{}", kUsage);
      std::exit(0);
    }
    if (is("-n")) {
      options.num_processes = parse_positive_int("-n", value_of("-n"));
    } else if (is("--devices-per-process")) {
      options.devices_per_process = parse_positive_int("--devices-per-process", value_of("--devices-per-process"));
    } else if (is("--timeout")) {
      options.timeout_s = parse_seconds("--timeout", value_of("--timeout"));
    } else if (arg.starts_with("-")) {
      usage_error(fmt::format("unknown option '{}'", arg));
    } else {
      break;  // the program, without a "--" before it
    }
  }
  for (; i < argc; ++i) options.command.emplace_back(argv[i]);
  if (options.num_processes == 0) usage_error("-n N is required");
  if (options.command.empty()) usage_error("no program to run after '--'");
  return options;
}

std::string signal_name(int signal_number) {
  switch (signal_number) {
    case SIGHUP: return "SIGHUP";
    case SIGINT: return "SIGINT";
    case SIGQUIT: return "SIGQUIT";
    case SIGILL: return "SIGILL";
    case SIGTRAP: return "SIGTRAP";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGKILL: return "SIGKILL";
    case SIGUSR1: return "SIGUSR1";
    case SIGSEGV: return "SIGSEGV";
    case SIGUSR2: return "SIGUSR2";
    case SIGPIPE: return "SIGPIPE";
    case SIGALRM: return "SIGALRM";
    case SIGTERM: return "SIGTERM";
    case SIGXCPU: return "SIGXCPU";
    case SIGXFSZ: return "SIGXFSZ";
    case SIGSYS: return "SIGSYS";
    default: return fmt::format("signal {}", signal_number);
  }
}

void write_all(int fd, std::string_view text) {
  while (!text.empty()) {
    ssize_t n = ::write(fd, text.data(), text.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return;  // our own output is gone (a closed pipe): the run goes on regardless
    }
    text.remove_prefix(size_t(n));
  }
}

void announce(const std::string& message) { write_all(STDERR_FILENO, "[launch] " + message + "\n"); }

// A free port on 127.0.0.1 at the time of asking (bind port 0, read it back, close).
int pick_free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof(address);
  int port = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0)
    port = ntohs(address.sin_port);
  ::close(fd);
  return port;
}

// SIGCHLD, SIGINT and SIGTERM arrive as one byte each (the signal's number) on this pipe, so the
// main loop's poll() sees them along with the processes' output.
int g_signal_pipe_write = -1;

void on_signal(int signal_number) {
  int saved_errno = errno;
  auto byte = static_cast<char>(signal_number);
  [[maybe_unused]] ssize_t ignored = ::write(g_signal_pipe_write, &byte, 1);
  errno = saved_errno;
}

void set_flags(int fd, int fd_flags, int status_flags) {
  if (fd_flags != 0) ::fcntl(fd, F_SETFD, ::fcntl(fd, F_GETFD) | fd_flags);
  if (status_flags != 0) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | status_flags);
}

// One of a process's output pipes, and the start of a line not finished yet.
struct OutputStream {
  int fd = -1;  // -1 once closed
  int sink = STDOUT_FILENO;
  std::string pending;
};

struct Process {
  int index = 0;
  pid_t pid = -1;
  bool running = false;
  OutputStream out, err;
};

class Launcher {
 public:
  explicit Launcher(Options options) : options_(std::move(options)) {}
  int run();

 private:
  bool start_processes();
  void start_process(Process& process, int port, int stdout_write, int stderr_write);
  void read_output(Process& process, OutputStream& stream);
  void emit_lines(const Process& process, OutputStream& stream, bool at_end);
  void close_stream(const Process& process, OutputStream& stream);
  void reap();
  void on_exit(Process& process, int status);
  void handle_signals();
  // Sends `signal_number` to the process group of every process still running.
  void signal_all(int signal_number);
  // Stops the run with `exit_code` (unless one is set already): SIGTERM now, SIGKILL after the grace period.
  void stop(int exit_code);
  bool any_running() const;
  bool any_stream_open() const;

  Options options_;
  std::vector<Process> processes_;
  int signal_pipe_read_ = -1;
  std::optional<int> exit_code_;  // set by the first failure, the timeout or a signal
  bool stopping_ = false;
  bool forwarded_signal_ = false;
  Clock::time_point kill_at_ = Clock::time_point::max();
  Clock::time_point timeout_at_ = Clock::time_point::max();
  Clock::time_point drain_until_ = Clock::time_point::max();
};

void Launcher::start_process(Process& process, int port, int stdout_write, int stderr_write) {
  // In the child (signals blocked): only what exec needs, then the program.
  for (int signal_number : {SIGINT, SIGTERM, SIGCHLD, SIGPIPE}) ::signal(signal_number, SIG_DFL);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::setpgid(0, 0);
  int null_fd = ::open("/dev/null", O_RDONLY);
  if (null_fd >= 0) ::dup2(null_fd, STDIN_FILENO);
  ::dup2(stdout_write, STDOUT_FILENO);
  ::dup2(stderr_write, STDERR_FILENO);
  ::setenv("CJAX_COORDINATOR_ADDRESS", fmt::format("127.0.0.1:{}", port).c_str(), 1);
  ::setenv("CJAX_NUM_PROCESSES", std::to_string(options_.num_processes).c_str(), 1);
  ::setenv("CJAX_PROCESS_ID", std::to_string(process.index).c_str(), 1);
  if (options_.devices_per_process > 0)
    ::setenv("CJAX_NUM_CPU_DEVICES", std::to_string(options_.devices_per_process).c_str(), 1);
  std::vector<char*> argv;
  for (std::string& arg : options_.command) argv.push_back(arg.data());
  argv.push_back(nullptr);
  ::execvp(argv[0], argv.data());
  write_all(STDERR_FILENO, fmt::format("cjax_launch: cannot run '{}': {}\n", argv[0], std::strerror(errno)));
  ::_exit(127);
}

bool Launcher::start_processes() {
  int port = pick_free_port();
  if (port < 0) {
    announce(fmt::format("cannot find a free port on 127.0.0.1: {}", std::strerror(errno)));
    return false;
  }
  processes_.resize(size_t(options_.num_processes));
  for (int k = 0; k < options_.num_processes; ++k) {
    Process& process = processes_[size_t(k)];
    process.index = k;
    int stdout_pipe[2], stderr_pipe[2];
    if (::pipe(stdout_pipe) != 0) {
      announce(fmt::format("cannot start process {}: {}", k, std::strerror(errno)));
      return false;
    }
    if (::pipe(stderr_pipe) != 0) {
      announce(fmt::format("cannot start process {}: {}", k, std::strerror(errno)));
      ::close(stdout_pipe[0]);
      ::close(stdout_pipe[1]);
      return false;
    }
    // Close-on-exec keeps every other process's pipes out of each program (dup2 clears it on 1 and 2).
    for (int fd : {stdout_pipe[0], stdout_pipe[1], stderr_pipe[0], stderr_pipe[1]}) set_flags(fd, FD_CLOEXEC, 0);
    // Signals stay blocked across fork until the child has dropped the launcher's handlers: one
    // arriving in between would otherwise be written to the launcher's signal pipe.
    sigset_t handled, previous;
    sigemptyset(&handled);
    for (int signal_number : {SIGCHLD, SIGINT, SIGTERM}) sigaddset(&handled, signal_number);
    ::sigprocmask(SIG_BLOCK, &handled, &previous);
    pid_t pid = ::fork();
    if (pid == 0) start_process(process, port, stdout_pipe[1], stderr_pipe[1]);
    ::sigprocmask(SIG_SETMASK, &previous, nullptr);
    ::close(stdout_pipe[1]);
    ::close(stderr_pipe[1]);
    if (pid < 0) {
      announce(fmt::format("cannot start process {}: {}", k, std::strerror(errno)));
      ::close(stdout_pipe[0]);
      ::close(stderr_pipe[0]);
      return false;
    }
    ::setpgid(pid, pid);  // also here, so that the group exists before any signal_all
    process.pid = pid;
    process.running = true;
    process.out = {stdout_pipe[0], STDOUT_FILENO, {}};
    process.err = {stderr_pipe[0], STDERR_FILENO, {}};
    set_flags(process.out.fd, 0, O_NONBLOCK);
    set_flags(process.err.fd, 0, O_NONBLOCK);
  }
  return true;
}

void Launcher::emit_lines(const Process& process, OutputStream& stream, bool at_end) {
  std::string prefix = fmt::format("[process {}] ", process.index);
  std::string text;
  size_t start = 0;
  for (size_t newline; (newline = stream.pending.find('\n', start)) != std::string::npos; start = newline + 1)
    text += prefix + stream.pending.substr(start, newline + 1 - start);
  stream.pending.erase(0, start);
  if ((at_end && !stream.pending.empty()) || stream.pending.size() >= kMaxLineBytes) {
    text += prefix + stream.pending + "\n";
    stream.pending.clear();
  }
  write_all(stream.sink, text);
}

void Launcher::close_stream(const Process& process, OutputStream& stream) {
  emit_lines(process, stream, /*at_end=*/true);
  ::close(stream.fd);
  stream.fd = -1;
}

void Launcher::read_output(Process& process, OutputStream& stream) {
  char buffer[16384];
  ssize_t n = ::read(stream.fd, buffer, sizeof(buffer));
  if (n > 0) {
    stream.pending.append(buffer, size_t(n));
    emit_lines(process, stream, /*at_end=*/false);
  } else if (n == 0 || (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK)) {
    close_stream(process, stream);
  }
}

void Launcher::signal_all(int signal_number) {
  for (const Process& process : processes_)
    if (process.running) ::kill(-process.pid, signal_number);
}

void Launcher::stop(int exit_code) {
  if (!exit_code_) exit_code_ = exit_code;
  if (stopping_) return;
  stopping_ = true;
  signal_all(SIGTERM);
  kill_at_ = Clock::now() + kGraceBeforeKill;
}

void Launcher::on_exit(Process& process, int status) {
  process.running = false;
  // What the process wrote before it exited comes out before the launcher's word on it.
  for (OutputStream* stream : {&process.out, &process.err})
    for (int reads = 0; stream->fd >= 0 && reads < 64; ++reads) {
      pollfd readable{stream->fd, POLLIN, 0};
      if (::poll(&readable, 1, 0) <= 0) break;
      read_output(process, *stream);
    }
  bool failed = WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) != 0);
  if (!failed || stopping_) return;  // exits caused by the stop itself are not news
  if (WIFSIGNALED(status)) {
    announce(fmt::format("process {} was killed by signal {}", process.index, signal_name(WTERMSIG(status))));
    stop(128 + WTERMSIG(status));
  } else {
    announce(fmt::format("process {} exited with code {}", process.index, WEXITSTATUS(status)));
    stop(WEXITSTATUS(status));
  }
}

void Launcher::reap() {
  for (Process& process : processes_) {
    if (!process.running) continue;
    int status = 0;
    pid_t pid = ::waitpid(process.pid, &status, WNOHANG);
    if (pid == process.pid && (WIFEXITED(status) || WIFSIGNALED(status))) on_exit(process, status);
  }
}

void Launcher::handle_signals() {
  char signals[64];
  ssize_t n;
  while ((n = ::read(signal_pipe_read_, signals, sizeof(signals))) > 0) {
    for (ssize_t i = 0; i < n; ++i) {
      int signal_number = signals[i];
      if (signal_number == SIGCHLD) continue;  // reap() runs after every wake-up
      if (forwarded_signal_) {
        announce(fmt::format("got {} again; killing every process", signal_name(signal_number)));
        signal_all(SIGKILL);
        continue;
      }
      forwarded_signal_ = true;
      announce(fmt::format("got {}; passing it on to every process", signal_name(signal_number)));
      if (!exit_code_) exit_code_ = 128 + signal_number;
      stopping_ = true;  // the processes decide how to end; a second signal kills them
      signal_all(signal_number);
    }
  }
}

bool Launcher::any_running() const {
  return std::any_of(processes_.begin(), processes_.end(), [](const Process& p) { return p.running; });
}

bool Launcher::any_stream_open() const {
  return std::any_of(processes_.begin(), processes_.end(),
                     [](const Process& p) { return p.out.fd >= 0 || p.err.fd >= 0; });
}

int Launcher::run() {
  int signal_pipe[2];
  if (::pipe(signal_pipe) != 0) {
    announce(fmt::format("cannot create a pipe: {}", std::strerror(errno)));
    return 1;
  }
  for (int fd : signal_pipe) set_flags(fd, FD_CLOEXEC, O_NONBLOCK);
  signal_pipe_read_ = signal_pipe[0];
  g_signal_pipe_write = signal_pipe[1];
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  for (int signal_number : {SIGCHLD, SIGINT, SIGTERM}) ::sigaction(signal_number, &action, nullptr);
  ::signal(SIGPIPE, SIG_IGN);  // a closed stdout must not kill the launcher and orphan the processes

  if (!start_processes()) {
    stop(1);
    reap();
  }
  if (options_.timeout_s)
    timeout_at_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(std::min(*options_.timeout_s, 1e9)));
  bool timed_out = false;
  for (;;) {
    Clock::time_point now = Clock::now();
    if (!any_running()) {
      if (!any_stream_open()) break;
      if (drain_until_ == Clock::time_point::max()) drain_until_ = now + kDrainAfterExit;
      if (now >= drain_until_) break;
    }
    if (!timed_out && now >= timeout_at_) {
      timed_out = true;
      if (!exit_code_) {
        announce(fmt::format("timed out after {:g} s; stopped every process", *options_.timeout_s));
        stop(124);
      } else if (kill_at_ == Clock::time_point::max()) {
        // A stop already under way after a forwarded signal: the time limit still ends it.
        signal_all(SIGTERM);
        kill_at_ = now + kGraceBeforeKill;
      }
    }
    if (now >= kill_at_) {
      signal_all(SIGKILL);
      kill_at_ = Clock::time_point::max();
    }

    std::vector<pollfd> fds = {{signal_pipe_read_, POLLIN, 0}};
    std::vector<std::pair<Process*, OutputStream*>> streams;
    for (Process& process : processes_)
      for (OutputStream* stream : {&process.out, &process.err})
        if (stream->fd >= 0) {
          fds.push_back({stream->fd, POLLIN, 0});
          streams.emplace_back(&process, stream);
        }
    Clock::time_point wake_at = std::min({timeout_at_, kill_at_, drain_until_});
    int timeout_ms = -1;
    if (wake_at != Clock::time_point::max())
      timeout_ms = int(std::clamp<int64_t>(std::chrono::ceil<std::chrono::milliseconds>(wake_at - Clock::now()).count(),
                                           0, INT_MAX));
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) {
      announce(fmt::format("poll failed: {}", std::strerror(errno)));
      stop(1);
    }
    if (fds[0].revents != 0) handle_signals();
    for (size_t i = 1; i < fds.size(); ++i)
      if (fds[i].revents != 0) read_output(*streams[i - 1].first, *streams[i - 1].second);
    reap();
  }
  for (Process& process : processes_)
    for (OutputStream* stream : {&process.out, &process.err})
      if (stream->fd >= 0) close_stream(process, *stream);
  return exit_code_.value_or(0);
}

}  // namespace

int main(int argc, char** argv) {
  Options options = parse_options(argc, argv);
  return Launcher(std::move(options)).run();
}
