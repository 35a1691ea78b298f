// Which collectives a program executes (kind, axes, per-device shapes, dtype, forward or
// backward), for tests and for reasoning about communication:
//
//   auto listed = debug::collectives(make_jaxpr(jit(grad(loss)))(params, batch));   // staged
//   debug::CollectiveRecorder rec;                       // executed, while `rec` is alive
//   jit(grad(loss))(params, batch);
//   for (const auto& c : rec.records()) std::cout << c.str() << "\n";
//   // backward psum_invariant over ('batch',) f32[784,128] -> f32[784,128] (401408 bytes)
//
// The phase of a collective is Backward when it belongs to the transpose of a shard_map (the
// backward pass of grad/vjp) or, in a sharded jit, when the partitioner inserted it for an
// equation of the backward pass (a weight gradient's reduce-scatter); Forward otherwise. The
// latter needs source info (on by default, config::set_capture_source_info). pvary and
// axis_index move no data (communicates == false); they are listed so that the varying-axes
// casts are visible.
#pragma once
#include <string>
#include <vector>

#include "cjax/array.h"
#include "cjax/make_jaxpr.h"

namespace cjax::debug {

enum class Phase { Forward, Backward };

struct CollectiveRecord {
  std::string kind;               // primitive name: psum_invariant, all_gather, reduce_scatter, ...
  std::vector<std::string> axes;  // mesh axes it acts over
  Shape in_shape, out_shape;      // per-device block shapes
  DType dtype = DType::float32;
  Phase phase = Phase::Forward;
  bool communicates = true;  // false for pvary and axis_index
  int64_t bytes = 0;         // size of the per-device operand
  std::string str() const;   // "backward psum_invariant over ('batch',) f32[784,128] -> f32[784,128] (401408 bytes)"
};

// Every collective equation of `jaxpr`, recursively (inside shard_map, jit, cond, scan, ...), in
// program order.
std::vector<CollectiveRecord> collectives(const ClosedJaxpr& jaxpr);

// Records the collectives executed by staged shard_map bodies (once per collective per run, as
// seen by device 0) while it is alive. One recorder at a time.
class CollectiveRecorder {
 public:
  CollectiveRecorder();
  ~CollectiveRecorder();
  CollectiveRecorder(const CollectiveRecorder&) = delete;
  CollectiveRecorder& operator=(const CollectiveRecorder&) = delete;
  std::vector<CollectiveRecord> records() const;
  void clear();
};

}  // namespace cjax::debug
