// The CPU's BufferCommunicator across processes (backends/cpu/process_communicator.h).
//
// Each operation is the in-process rendezvous of this process's members (core/backend/
// rendezvous_communicator.h), inside which the first local member runs the exchange between
// processes on a Gloo context of the group's processes, on behalf of all of them:
//   * a signature allgather first: every process must be at the same operation with the same
//     sizes, else CollectiveError lists what each process ran (instead of a hang or garbage);
//   * all_reduce: process q reduces elements [q·m, (q+1)·m) over every rank, in rank order (an
//     alltoallv brings it every rank's slice), and an allgatherv spreads the slices: the bytes a
//     ring all-reduce moves, and the same values, bit for bit, as the in-process communicator;
//     from 4 MB on the same exchange runs in 4 MB chunks on Gloo's unbound buffers, each chunk
//     reduced and passed on while the later ones are in flight (10-20% more bandwidth between two
//     processes here);
//   * reduce_scatter, all_to_all, permute: one alltoallv of exactly the blocks each process needs;
//     all_gather: one allgatherv.
// A process that dies shows as a closed connection; one that does not come, as Gloo's timeout
// (config::collective_timeout_seconds). Both raise CollectiveError naming the process, from the
// coordinator's record of who disconnected.
#include "backends/cpu/process_communicator.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gloo/allgather.h>
#include <gloo/allgatherv.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "cjax/distributed.h"
#include "cjax/errors.h"
#include "core/array/visit_dtype.h"
#include "core/backend/backend.h"
#include "core/backend/rendezvous_communicator.h"
#include "core/distributed/kv_store.h"
#include "core/distributed/runtime.h"
#include "core/lax/scalar_fns.h"

namespace cjax::cpu {
namespace {

// Gloo's rendezvous through the coordinator's key-value store.
class CoordinatorStore final : public gloo::rendezvous::Store {
 public:
  CoordinatorStore(distributed::KvStoreClient& kv, std::string prefix, std::chrono::milliseconds timeout)
      : kv_(kv), prefix_(std::move(prefix)), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override { kv_.set(prefix_ + key, data); }
  std::vector<char> get(const std::string& key) override {
    wait({key}, timeout_);
    return kv_.get(prefix_ + key, timeout_);
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  // Returns once every rank of the group has called it. Gloo's connectFullMesh connects to each
  // peer as soon as that peer's address is in the store; a process that gave up on the group
  // (because another one died) leaves an address behind that nobody answers, and a late process
  // would wait on it. With this rendezvous first, no process connects until all have arrived.
  void arrive(int rank, int size) {
    auto arrived = [](int r) { return fmt::format("arrived/{}", r); };
    set(arrived(rank), {});
    std::vector<std::string> keys;
    for (int r = 0; r < size; ++r) keys.push_back(arrived(r));
    wait(keys, timeout_);
  }
  // Polls rather than blocking in the client: groups connect on several threads at once, and a
  // blocked request would hold up the client for the others.
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    for (const std::string& k : keys)
      for (int polls = 0; !kv_.check(prefix_ + k); ++polls) {
        // Raised as the transport's errors are, so that the communicator names the process at fault.
        if (std::chrono::steady_clock::now() > deadline)
          throw gloo::IoException(fmt::format("timed out connecting: no '{}' in the coordinator's store", k));
        if (polls % 50 == 49 && !kv_.dead_processes().empty())
          throw gloo::IoException("connecting: a process of the group left the coordinator");
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
  }

 private:
  distributed::KvStoreClient& kv_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;
};

struct Connections {
  std::mutex mu;
  std::shared_ptr<gloo::transport::Device> device;
  // One context per group (its devices' ids), made on first use by every process of the group:
  // groups never share one, so operations of different groups may run at once.
  struct Entry {
    std::once_flag made;
    std::shared_ptr<gloo::rendezvous::Context> context;
    // Held while an operation runs on the context (two SPMD runs over one group take turns), and
    // the staging buffers those operations reuse (fresh large buffers cost page faults each time).
    std::mutex busy;
    std::vector<char> out, in, reduced;
  };
  std::map<std::vector<int>, std::shared_ptr<Entry>> contexts;
};
Connections& connections() {
  static Connections c;
  return c;
}
const bool g_close_hook = [] {
  distributed::on_shutdown(close_process_connections);
  return true;
}();

// memcpy, for sizes that may be 0 with null pointers (an empty block or an empty slice of a small
// all_reduce), which memcpy itself must not be given.
void copy_bytes(void* to, const void* from, size_t n) {
  if (n > 0) std::memcpy(to, from, n);
}

// all_reduces of at least this many bytes run pipelined, in chunks of all_reduce_chunk_bytes():
// 4 MB (0.25, 1, 2 and 4 MB measured between 2 processes on 2 cores: 4 MB was at least as fast
// as the others at 4-64 MB); CJAX_GLOO_CHUNK_KB (1-4096) changes it (the tests use 1 MB, so that
// their slices span several chunks).
constexpr size_t kPipelinedAllReduceBytes = size_t(4) << 20;
size_t all_reduce_chunk_bytes() {
  static const size_t bytes = size_t(positive_env_int("CJAX_GLOO_CHUNK_KB", 4096)) << 10;
  return bytes;
}

// What every process must agree on before an operation moves data.
struct Signature {
  char op[16] = {};
  uint64_t a = 0, b = 0, c = 0, sequence = 0;
  bool operator==(const Signature& o) const {
    return std::memcmp(op, o.op, sizeof(op)) == 0 && a == o.a && b == o.b && c == o.c && sequence == o.sequence;
  }
  std::string str() const {
    return fmt::format("{} #{} ({}, {}, {})", std::string(op, strnlen(op, sizeof(op))), sequence, a, b, c);
  }
};

class ProcessBufferCommunicator final : public RendezvousCommunicator {
 public:
  ProcessBufferCommunicator(std::vector<Device> group, std::vector<int> local_ranks, std::chrono::milliseconds timeout)
      // This process's other members wait while member 0 runs up to three Gloo operations, each
      // allowed `timeout`: their wait must outlast those, or a slow peer would make them report
      // member 0 missing.
      : RendezvousCommunicator(int(local_ranks.size()), 4 * timeout),
        group_(std::move(group)),
        local_(std::move(local_ranks)),
        timeout_(timeout) {
    for (const Device& d : group_) processes_.push_back(process_index_of(d));
    std::sort(processes_.begin(), processes_.end());
    processes_.erase(std::unique(processes_.begin(), processes_.end()), processes_.end());
    process_ranks_.assign(processes_.size(), {});
    for (int r = 0; r < int(group_.size()); ++r) {
      int q = int(std::find(processes_.begin(), processes_.end(), process_index_of(group_[size_t(r)])) -
                  processes_.begin());
      process_of_.push_back(q);
      position_.push_back(int(process_ranks_[size_t(q)].size()));
      process_ranks_[size_t(q)].push_back(r);
    }
    me_ = int(std::find(processes_.begin(), processes_.end(), process_index()) - processes_.begin());
    int next = 0;
    ranks_in_process_order_ = true;
    for (const auto& ranks : process_ranks_)
      for (int r : ranks) ranks_in_process_order_ = ranks_in_process_order_ && r == next++;
  }
  int size() const override { return int(group_.size()); }

  void all_reduce(int rank, const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override {
    run(rank, send, recv, "all_reduce", {count, size_t(dtype), size_t(op)}, [&] {
      if (count * itemsize(dtype) >= kPipelinedAllReduceBytes && processes_.size() > 1)
        return pipelined_all_reduce(count, dtype, op);
      size_t isz = itemsize(dtype), P = processes_.size(), per = (count + P - 1) / P;
      auto range = [&](size_t q) { return std::pair{std::min(count, q * per), std::min(count, (q + 1) * per)}; };
      auto [lo, hi] = range(size_t(me_));
      size_t mine = (hi - lo) * isz;
      // This process's own slices are read where they are, never sent to itself through the
      // transport. The send buffer of a single member is the alltoallv's input as it stands
      // (slices in process order) where the own slice is at one end, so it can be left out.
      Packets packets(P, *entry_);
      bool direct = local_.size() == 1 && (me_ == 0 || size_t(me_) + 1 == P);
      if (direct) packets.direct = static_cast<const char*>(sends()[0]) + (me_ == 0 && mine > 0 ? mine : 0);
      for (size_t q = 0; q < P; ++q) {
        if (q == size_t(me_)) continue;
        auto [qlo, qhi] = range(q);
        if (direct)
          packets.out_counts[q] = int64_t((qhi - qlo) * isz);
        else
          for (const void* s : sends()) packets.append(q, static_cast<const char*>(s) + qlo * isz, (qhi - qlo) * isz);
        packets.expect(q, process_ranks_[q].size() * mine);
      }
      alltoallv(packets);
      std::vector<char>& reduced = entry_->reduced;
      reduced.resize(mine);
      std::vector<const char*> by_rank(group_.size());
      for (size_t r = 0; r < group_.size(); ++r) {
        if (process_of_[r] == me_) {
          by_rank[r] = static_cast<const char*>(sends()[size_t(position_[r])]) + lo * isz;
        } else {
          by_rank[r] = packets.received(size_t(process_of_[r])) + size_t(position_[r]) * mine;
        }
      }
      reduce_in_rank_order(by_rank, reduced.data(), hi - lo, dtype, op);
      std::vector<size_t> counts;
      for (size_t q = 0; q < P; ++q) counts.push_back((range(q).second - range(q).first) * isz);
      allgatherv(reduced.data(), static_cast<char*>(recvs()[0]), counts);
      copy_to_other_members(count * isz);
    });
  }
  // The large all_reduce, as the one above (the same slices, the same rank order, so the same bits)
  // but in chunks of all_reduce_chunk_bytes() through Gloo's unbound buffers, so that the transfers
  // overlap the reductions: every chunk a process needs is requested at once; as the chunks of its
  // own slice arrive from every rank, it reduces each into its output and sends it on to the
  // other processes while the later chunks are still arriving.
  void pipelined_all_reduce(size_t count, DType dtype, ReduceOp op) {
    gloo::Context& ctx = *context();
    const size_t isz = itemsize(dtype), P = processes_.size(), per = (count + P - 1) / P;
    const size_t chunk = std::max<size_t>(1, all_reduce_chunk_bytes() / isz);
    auto range = [&](size_t q) { return std::pair{std::min(count, q * per), std::min(count, (q + 1) * per)}; };
    auto chunks_of = [&](size_t q) { return (range(q).second - range(q).first + chunk - 1) / chunk; };
    // Chunk c of slice q: its first element and its size in bytes.
    auto chunk_at = [&](size_t q, size_t c) {
      auto [qlo, qhi] = range(q);
      size_t first = qlo + c * chunk;
      return std::pair{first, (std::min(qhi, first + chunk) - first) * isz};
    };
    const uint64_t op_tag = uint64_t(sequence_ & 0xff) << 40;
    auto slot = [&](uint64_t phase, size_t member, size_t c) {
      return (uint64_t(0xc7) << 56) | (phase << 48) | op_tag | (uint64_t(member) << 32) | uint64_t(c);
    };
    auto [lo, hi] = range(size_t(me_));
    const size_t mine = (hi - lo) * isz, my_chunks = chunks_of(size_t(me_));
    char* result = static_cast<char*>(recvs()[0]);

    // Phase 1 in: chunk c of this slice from every rank of the other processes, into the staging
    // buffer ([remote rank][slice]), one unbound buffer per chunk to tell when it is complete.
    std::vector<int> remote_ranks;
    for (size_t r = 0; r < group_.size(); ++r)
      if (process_of_[r] != me_) remote_ranks.push_back(int(r));
    std::vector<char>& staging = entry_->in;
    staging.resize(remote_ranks.size() * mine);
    std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> arriving;
    for (size_t c = 0; c < my_chunks; ++c) {
      arriving.push_back(ctx.createUnboundBuffer(staging.data(), staging.size()));
      auto [first, bytes] = chunk_at(size_t(me_), c);
      for (size_t j = 0; j < remote_ranks.size(); ++j) {
        int r = remote_ranks[j];
        arriving.back()->recv(process_of_[size_t(r)], slot(1, size_t(position_[size_t(r)]), c),
                              j * mine + (first - lo) * isz, bytes);
      }
    }
    // Phase 2 in: the reduced chunks of the other slices, straight into the output.
    auto output = ctx.createUnboundBuffer(result, count * isz);
    size_t expected = 0;
    for (size_t q = 0; q < P; ++q) {
      if (q == size_t(me_)) continue;
      for (size_t c = 0; c < chunks_of(q); ++c, ++expected) {
        auto [first, bytes] = chunk_at(q, c);
        output->recv(int(q), slot(2, 0, c), first * isz, bytes);
      }
    }
    // Phase 1 out: every local member's chunks of the other slices, chunk by chunk.
    std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> inputs;
    for (const void* s : sends()) inputs.push_back(ctx.createUnboundBuffer(const_cast<void*>(s), count * isz));
    size_t sent = 0;
    for (size_t c = 0;; ++c) {
      bool any = false;
      for (size_t q = 0; q < P; ++q) {
        if (q == size_t(me_) || c >= chunks_of(q)) continue;
        any = true;
        auto [first, bytes] = chunk_at(q, c);
        for (size_t i = 0; i < inputs.size(); ++i) inputs[i]->send(int(q), slot(1, i, c), first * isz, bytes);
        ++sent;
      }
      if (!any) break;
    }
    // Reduce each chunk of this slice as it completes, and pass it on.
    auto wait = [&](bool ok, const char* what) {
      if (!ok) throw CollectiveError(fmt::format("all_reduce over devices {}: {} was aborted", group_str(), what));
    };
    std::vector<const char*> by_rank(group_.size());
    for (size_t c = 0; c < my_chunks; ++c) {
      for (size_t j = 0; j < remote_ranks.size(); ++j) wait(arriving[c]->waitRecv(timeout_), "a receive");
      auto [first, bytes] = chunk_at(size_t(me_), c);
      for (size_t r = 0, j = 0; r < group_.size(); ++r)
        by_rank[r] = process_of_[r] == me_ ? static_cast<const char*>(sends()[size_t(position_[r])]) + first * isz
                                           : staging.data() + (j++) * mine + (first - lo) * isz;
      reduce_in_rank_order(by_rank, result + first * isz, bytes / isz, dtype, op);
      for (size_t q = 0; q < P; ++q)
        if (q != size_t(me_)) output->send(int(q), slot(2, 0, c), first * isz, bytes);
    }
    for (size_t k = 0; k < expected; ++k) wait(output->waitRecv(timeout_), "a receive");
    for (size_t k = 0; k < my_chunks * (P - 1); ++k) wait(output->waitSend(timeout_), "a send");
    for (auto& in : inputs)
      for (size_t k = 0; k < sent; ++k) wait(in->waitSend(timeout_), "a send");
    copy_to_other_members(count * isz);
  }

  void reduce_scatter(int rank, const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override {
    run(rank, send, recv, "reduce_scatter", {count, size_t(dtype), size_t(op)}, [&] {
      size_t block = count * itemsize(dtype);
      Packets packets = exchange_blocks(block);
      std::vector<const char*> by_rank(group_.size());
      for (size_t i = 0; i < local_.size(); ++i) {
        for (size_t r = 0; r < group_.size(); ++r) by_rank[r] = block_from(packets, r, i, block);
        reduce_in_rank_order(by_rank, static_cast<char*>(recvs()[i]), count, dtype, op);
      }
    });
  }

  void all_gather(int rank, const void* send, void* recv, size_t bytes) override {
    run(rank, send, recv, "all_gather", {bytes, 0, 0}, [&] {
      std::vector<char> mine;
      const char* input = static_cast<const char*>(sends()[0]);
      if (local_.size() > 1) {
        for (const void* s : sends())
          mine.insert(mine.end(), static_cast<const char*>(s), static_cast<const char*>(s) + bytes);
        input = mine.data();
      }
      std::vector<size_t> counts;
      for (const auto& ranks : process_ranks_) counts.push_back(ranks.size() * bytes);
      if (ranks_in_process_order_) {  // the gathered blocks land in rank order as they are
        allgatherv(input, static_cast<char*>(recvs()[0]), counts);
      } else {
        std::vector<char> all(group_.size() * bytes);
        allgatherv(input, all.data(), counts);
        size_t offset = 0;
        for (const auto& ranks : process_ranks_)
          for (int r : ranks) {
            copy_bytes(static_cast<char*>(recvs()[0]) + size_t(r) * bytes, all.data() + offset, bytes);
            offset += bytes;
          }
      }
      copy_to_other_members(group_.size() * bytes);
    });
  }

  void all_to_all(int rank, const void* send, void* recv, size_t bytes) override {
    run(rank, send, recv, "all_to_all", {bytes, 0, 0}, [&] {
      Packets packets = exchange_blocks(bytes);
      for (size_t r = 0; r < group_.size(); ++r)  // recv_i block r = send_r block (local i)
        for (size_t i = 0; i < local_.size(); ++i)
          copy_bytes(static_cast<char*>(recvs()[i]) + r * bytes, block_from(packets, r, i, bytes), bytes);
    });
  }

  void permute(int rank, const void* send, void* recv, size_t bytes,
               std::span<const std::pair<int, int>> pairs) override {
    check_pairs(pairs);
    uint64_t pairs_hash = 0;
    for (auto [s, d] : pairs) pairs_hash = pairs_hash * 1000003u + uint64_t(s) * 4099u + uint64_t(d);
    run(rank, send, recv, "permute", {bytes, pairs.size(), pairs_hash}, [&] {
      size_t P = processes_.size();
      Packets packets(P, *entry_);
      std::vector<size_t> incoming(P, 0);
      for (size_t q = 0; q < P; ++q)
        for (auto [s, d] : pairs)
          if (size_t(process_of_[size_t(s)]) == size_t(me_) && size_t(process_of_[size_t(d)]) == q)
            packets.append(q, sends()[size_t(position_[size_t(s)])], bytes);
      for (auto [s, d] : pairs)
        if (size_t(process_of_[size_t(d)]) == size_t(me_)) incoming[size_t(process_of_[size_t(s)])] += bytes;
      for (size_t q = 0; q < P; ++q) packets.expect(q, incoming[q]);
      alltoallv(packets);
      std::vector<size_t> read(P, 0);
      std::vector<bool> written(local_.size(), false);
      for (auto [s, d] : pairs) {
        size_t from = size_t(process_of_[size_t(s)]);
        if (size_t(process_of_[size_t(d)]) != size_t(me_)) continue;
        size_t i = size_t(position_[size_t(d)]);
        copy_bytes(recvs()[i], packets.received(from) + read[from], bytes);
        read[from] += bytes;
        written[i] = true;
      }
      for (size_t i = 0; i < local_.size(); ++i)
        if (!written[i] && bytes > 0) std::memset(recvs()[i], 0, bytes);
    });
  }

  void barrier(int rank) override {
    run(rank, nullptr, nullptr, "barrier", {0, 0, 0}, [&] {
      gloo::BarrierOptions opts(context());
      opts.setTimeout(timeout_);
      gloo::barrier(opts);
    });
  }

 private:
  // Bytes bound for each process, packed contiguously, and room for what each sends back.
  // Bytes bound for each process, packed contiguously in process order (append in that order),
  // and room for what each process sends back.
  // Bytes bound for each process, packed contiguously in process order (append in that order),
  // and room for what each process sends back; the buffers are the group's staging buffers.
  struct Packets {
    Packets(size_t P, Connections::Entry& e) : out(e.out), in(e.in), out_counts(P, 0), in_counts(P, 0) { out.clear(); }
    void append(size_t q, const void* p, size_t n) {
      out.insert(out.end(), static_cast<const char*>(p), static_cast<const char*>(p) + n);
      out_counts[q] += int64_t(n);
    }
    void expect(size_t q, size_t n) { in_counts[q] = int64_t(n); }
    const char* received(size_t q) const { return in.data() + in_offsets[q]; }
    std::vector<char>&out, &in;
    const char* direct = nullptr;  // instead of `out`: a buffer laid out as out would be
    std::vector<int64_t> out_counts, in_counts;
    std::vector<size_t> in_offsets;
  };

  // The local member `rank` (its index among this process's members) takes part in operation
  // `op`; the first member runs `exchange` for all of them while the others wait.
  template <class F>
  void run(int rank, const void* send, void* recv, const char* op, std::array<uint64_t, 3> sizes, F&& exchange) {
    int local_rank = int(std::find(local_.begin(), local_.end(), rank) - local_.begin());
    if (local_rank == int(local_.size()))
      throw CollectiveError(
          fmt::format("internal: rank {} of a collective is not a device of process {}", rank, process_index()));
    RendezvousCommunicator::exchange(local_rank, send, recv, op, [&] {
      if (local_rank != 0) return;
      try {
        context();
        std::lock_guard turn(entry_->busy);
        check_signature(op, sizes);
        exchange();
      } catch (const gloo::Exception& e) {
        std::string why = describe_failure(op, e.what());
        abort(why);
        throw CollectiveError(why);
      } catch (const std::exception& e) {
        abort(e.what());
        throw;
      }
    });
  }

  void check_signature(const char* op, std::array<uint64_t, 3> sizes) {
    Signature mine;
    std::strncpy(mine.op, op, sizeof(mine.op) - 1);
    mine.a = sizes[0];
    mine.b = sizes[1];
    mine.c = sizes[2];
    mine.sequence = ++sequence_;
    std::vector<Signature> all(processes_.size());
    gloo::AllgatherOptions opts(context());
    opts.setInput(reinterpret_cast<char*>(&mine), sizeof(Signature));
    opts.setOutput(reinterpret_cast<char*>(all.data()), sizeof(Signature) * all.size());
    opts.setTimeout(timeout_);
    gloo::allgather(opts);
    if (std::all_of(all.begin(), all.end(), [&](const Signature& s) { return s == mine; })) return;
    std::vector<std::string> lines;
    for (size_t q = 0; q < all.size(); ++q)
      lines.push_back(fmt::format("  process {}: {}", processes_[q], all[q].str()));
    throw CollectiveError(
        fmt::format("the processes of a collective over devices {} ran different operations:\n{}\nEvery process must "
                    "run "
                    "the same program (the same collectives, in the same order, on the same shapes)",
                    group_str(), fmt::join(lines, "\n")));
  }

  // Every member's send is `group size` blocks of `block` bytes, block t meant for rank t: each
  // process receives the blocks meant for its members, from every rank.
  Packets exchange_blocks(size_t block) {
    Packets packets(processes_.size(), *entry_);
    for (size_t q = 0; q < processes_.size(); ++q) {
      for (const void* s : sends())
        for (int t : process_ranks_[q]) packets.append(q, static_cast<const char*>(s) + size_t(t) * block, block);
      packets.expect(q, process_ranks_[q].size() * local_.size() * block);
    }
    alltoallv(packets);
    return packets;
  }
  // After exchange_blocks: the block rank r sent to this process's member i.
  const char* block_from(const Packets& p, size_t r, size_t i, size_t block) const {
    return p.received(size_t(process_of_[r])) + (size_t(position_[r]) * local_.size() + i) * block;
  }

  void alltoallv(Packets& p) {
    size_t total = 0;
    for (int64_t n : p.in_counts) {
      p.in_offsets.push_back(total);
      total += size_t(n);
    }
    p.in.resize(total);
    gloo::AlltoallvOptions opts(context());
    opts.setInput(const_cast<char*>(p.direct ? p.direct : p.out.data()), p.out_counts);
    opts.setOutput(p.in.data(), p.in_counts);
    opts.setTimeout(timeout_);
    gloo::alltoallv(opts);
  }

  void allgatherv(const char* mine, char* all, std::vector<size_t> counts) {
    gloo::AllgathervOptions opts(context());
    opts.setInput(const_cast<char*>(mine), counts[size_t(me_)]);
    opts.setOutput(all, std::move(counts));
    opts.setTimeout(timeout_);
    gloo::allgatherv(opts);
  }

  // out[i] = op over ranks r (in rank order) of by_rank[r][i]: rank by rank over the whole slice
  // (the same order per element, and loops the compiler vectorizes), the op fixed per loop.
  static void reduce_in_rank_order(const std::vector<const char*>& by_rank, char* out, size_t count, DType dtype,
                                   ReduceOp op) {
    visit_dtype(dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      T* o = reinterpret_cast<T*>(out);
      if (by_rank.size() == 1) return copy_bytes(o, by_rank[0], count * sizeof(T));
      auto accumulate = [&](auto combine) {
        const T *first = reinterpret_cast<const T*>(by_rank[0]), *second = reinterpret_cast<const T*>(by_rank[1]);
        for (size_t i = 0; i < count; ++i) o[i] = combine(first[i], second[i]);  // one pass for the first two
        for (size_t r = 2; r < by_rank.size(); ++r) {
          const T* in = reinterpret_cast<const T*>(by_rank[r]);
          for (size_t i = 0; i < count; ++i) o[i] = combine(o[i], in[i]);
        }
      };
      switch (op) {
        case ReduceOp::Sum: return accumulate([](T a, T b) { return scalar::reduce_combine(a, b, ReduceOp::Sum); });
        case ReduceOp::Prod: return accumulate([](T a, T b) { return scalar::reduce_combine(a, b, ReduceOp::Prod); });
        case ReduceOp::Max: return accumulate([](T a, T b) { return scalar::reduce_combine(a, b, ReduceOp::Max); });
        case ReduceOp::Min: return accumulate([](T a, T b) { return scalar::reduce_combine(a, b, ReduceOp::Min); });
      }
    });
  }

  void copy_to_other_members(size_t bytes) {
    for (size_t i = 1; i < local_.size(); ++i) copy_bytes(recvs()[i], recvs()[0], bytes);
  }

  std::shared_ptr<gloo::rendezvous::Context> context() {
    if (context_) return context_;
    Connections& c = connections();
    std::shared_ptr<Connections::Entry> entry;
    {
      std::lock_guard lk(c.mu);
      if (!c.device) {
        gloo::transport::tcp::attr attr;
        attr.hostname = distributed::transport_hostname();
        c.device = gloo::transport::tcp::CreateDevice(attr);
      }
      std::vector<int> key;
      for (const Device& d : group_) key.push_back(d.id());
      auto& e = c.contexts[key];
      if (!e) e = std::make_shared<Connections::Entry>();
      entry = e;
    }
    std::call_once(entry->made, [&] {
      distributed::KvStoreClient* kv = distributed::store();
      if (!kv) throw CollectiveError("a collective spans processes, but distributed::initialize has not run");
      CoordinatorStore store(*kv, fmt::format("gloo{}/{}/", distributed::generation(), group_ids()), timeout_);
      auto ctx = std::make_shared<gloo::rendezvous::Context>(me_, int(processes_.size()));
      ctx->setTimeout(timeout_);
      store.arrive(me_, int(processes_.size()));
      ctx->connectFullMesh(store, connections().device);
      entry->context = std::move(ctx);
    });
    context_ = entry->context;
    entry_ = entry;
    return context_;
  }

  std::string group_str() const {
    std::vector<std::string> names;
    for (const Device& d : group_) names.push_back(d.str());
    return fmt::format("[{}]", fmt::join(names, ", "));
  }

  // Which process failed, from the coordinator's record of connections (a crashed process drops
  // its connection; the record may lag the transport's error by a moment).
  std::string describe_failure(const char* op, const std::string& transport_error) {
    std::vector<int> dead;
    if (distributed::KvStoreClient* kv = distributed::store()) {
      for (int tries = 0; tries < 20 && dead.empty(); ++tries) {
        try {
          for (int p : kv->dead_processes())
            if (std::find(processes_.begin(), processes_.end(), p) != processes_.end()) dead.push_back(p);
        } catch (const std::exception&) {
          dead.push_back(0);  // the coordinator itself is gone
        }
        if (dead.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
    if (!dead.empty())
      return fmt::format("{} over devices {} failed: process(es) {} exited or crashed ({})", op, group_str(),
                         fmt::join(dead, ", "), transport_error);
    // A timeout: the processes that timed out too say so in the store; the others did not arrive.
    std::vector<int> missing;
    if (distributed::KvStoreClient* kv = distributed::store()) {
      try {
        std::string key = fmt::format("stuck{}/{}/{}/", distributed::generation(), group_ids(), sequence_);
        kv->set(key + std::to_string(process_index()), {});
        // The others time out as long after their own arrival: allow for arrivals some seconds apart.
        auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2) +
                        std::min<std::chrono::milliseconds>(timeout_, std::chrono::seconds(10));
        do {
          missing.clear();
          for (int p : processes_)
            if (!kv->check(key + std::to_string(p))) missing.push_back(p);
          if (missing.empty()) break;
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        } while (std::chrono::steady_clock::now() < deadline);
      } catch (const std::exception&) {
        missing.clear();
      }
    }
    if (missing.empty())
      for (int p : processes_)
        if (p != process_index()) missing.push_back(p);
    return fmt::format(
        "{} over devices {} failed after {} s: process{} {} did not arrive (it may be stuck, or running a different "
        "program); raise the limit with config::set_collective_timeout_seconds or CJAX_COLLECTIVE_TIMEOUT_S ({})",
        op, group_str(), double(timeout_.count()) / 1000, missing.size() > 1 ? "es" : "", fmt::join(missing, ", "),
        transport_error);
  }

  std::string group_ids() const {
    std::vector<int> ids;
    for (const Device& d : group_) ids.push_back(d.id());
    return fmt::format("{}", fmt::join(ids, ","));
  }

  std::vector<Device> group_;
  std::vector<int> local_;                       // this process's ranks, in rank order
  std::vector<int> processes_;                   // the group's processes, sorted; Gloo rank = index
  std::vector<std::vector<int>> process_ranks_;  // each process's ranks, in rank order
  std::vector<int> process_of_, position_;       // per rank: index into processes_, index among its ranks
  int me_ = 0;
  bool ranks_in_process_order_ = false;  // ranks 0.. on the first process, then the next, ...
  std::chrono::milliseconds timeout_;
  uint64_t sequence_ = 0;
  std::shared_ptr<gloo::rendezvous::Context> context_;
  std::shared_ptr<Connections::Entry> entry_;  // set with context_
};

}  // namespace

std::shared_ptr<BufferCommunicator> make_process_buffer_communicator(std::span<const Device> group,
                                                                     std::chrono::milliseconds timeout) {
  std::vector<int> local;
  for (int r = 0; r < int(group.size()); ++r)
    if (distributed::is_local(group[size_t(r)])) local.push_back(r);
  if (local.empty())
    throw CollectiveError(fmt::format("internal: process {} has no device in a communicator group", process_index()));
  return std::make_shared<ProcessBufferCommunicator>(std::vector<Device>(group.begin(), group.end()), std::move(local),
                                                     timeout);
}

void close_process_connections() {
  Connections& c = connections();
  std::lock_guard lk(c.mu);
  c.contexts.clear();
  c.device.reset();
}

}  // namespace cjax::cpu
