// KernelSpec -> LLVM IR -> machine code (llvm_codegen.h) for the host CPU.
//
// Each kernel becomes an internal body function whose buffer pointers are `noalias` parameters
// (so the loop vectorizer needs no run-time alias checks) and an exported wrapper with the
// uniform calling convention of kernel_spec.h. The inner column loop is a plain counted loop of
// scalar code: LLVM's loop vectorizer widens it to the host's vectors (16 floats with AVX-512),
// with FMA contraction allowed and reductions reassociated. Transcendental functions are our own
// inline approximations (llvm_math.h), so they vectorize too; the few without one (tan, asin, ...
// in some types) call libm per element and that loop stays scalar.
#include "backends/cpu/llvm_codegen.h"

#include <absl/container/flat_hash_map.h>
#include <fmt/format.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <llvm/IR/Verifier.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/raw_ostream.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <exception>
#include <functional>
#include <thread>
#include <unordered_map>

#include "backends/cpu/llvm_jit.h"
#include "backends/cpu/llvm_math.h"
#include "backends/cpu/llvm_scalar.h"
#include "cjax/errors.h"
#include "core/backend/parallel.h"

namespace cjax {
namespace {

using llvm::IRBuilder;
using llvm::Type;
using llvm::Value;
using Op = KernelNode::Op;
using cpu::is_float_like;
using cpu::is_unsigned_like;

class KernelEmitter : private cpu::ScalarCodegen {
 public:
  KernelEmitter(llvm::Module& m, const KernelSpec& spec) : ScalarCodegen(m), spec_(spec) {
    llvm::FastMathFlags fmf;
    fmf.setAllowContract(true);
    b_.setFastMathFlags(fmf);
  }

  void emit() {
    size_t nbuf = spec_.inputs.size() + spec_.outputs.size();
    Type* ptr = b_.getPtrTy();
    Type* i64 = b_.getInt64Ty();
    std::vector<Type*> body_params(nbuf + 1, ptr);
    for (int i = 0; i < 4; ++i) body_params.push_back(i64);
    auto* body_ty = llvm::FunctionType::get(b_.getVoidTy(), body_params, false);
    body_ = llvm::Function::Create(body_ty, llvm::Function::InternalLinkage, spec_.name + "_body", m_);
    cpu::set_host_attributes(*body_);
    for (size_t i = 0; i <= nbuf; ++i) body_->addParamAttr(unsigned(i), llvm::Attribute::NoAlias);
    emit_body(nbuf);

    auto* wrap_ty = llvm::FunctionType::get(b_.getVoidTy(), {ptr, ptr, i64, i64, i64, i64}, false);
    auto* wrap = llvm::Function::Create(wrap_ty, llvm::Function::ExternalLinkage, spec_.name, m_);
    cpu::set_host_attributes(*wrap);
    b_.SetInsertPoint(llvm::BasicBlock::Create(ctx_, "entry", wrap));
    std::vector<Value*> args;
    for (size_t i = 0; i < nbuf; ++i)
      args.push_back(b_.CreateLoad(ptr, b_.CreateConstInBoundsGEP1_64(ptr, wrap->getArg(0), i)));
    for (unsigned i = 1; i < 6; ++i) args.push_back(wrap->getArg(i));
    b_.CreateCall(body_, args);
    b_.CreateRetVoid();
  }

 private:
  const KernelSpec& spec_;
  llvm::Function* body_ = nullptr;
  std::vector<Value*> in_ptr_, out_ptr_, in_off_;
  Value* scratch_ = nullptr;
  Value* row_ = nullptr;
  Value* col_ = nullptr;
  std::unordered_map<int, Value*> row_vals_;  // row-level nodes, this row
  // 1 / v for a floating row-level v that divides full-level values: x / v becomes x * (1 / v),
  // one division per row instead of one per element (softmax's normalization; as PyTorch's CPU
  // softmax does). The product is within 1.5 ulp of the quotient (the division: 0.5 ulp).
  std::unordered_map<int, Value*> row_recips_;
  std::unordered_map<int, Value*> full_vals_;  // full-level nodes, this pass and column
  int lanes_ = 1;           // columns per full-level value: 1, or kVectorLanes in explicit vector code
  bool streaming_ = false;  // the columns being emitted store their outputs with streaming stores
  bool streamed_ = false;   // some pass uses streaming stores: fence them before returning

  // ---- types ----
  // Value types are lanes_of(...) of ScalarCodegen's element types: a vector of lanes_ elements
  // in explicit vector code, else the scalar.
  Type* lanes_of(Type* t) const { return lanes_ > 1 ? llvm::FixedVectorType::get(t, unsigned(lanes_)) : t; }

  Value* constant(const KernelNode& n) {
    Type* t = compute_type(n.dtype);
    if (n.dtype == DType::bool_) return b_.getInt1(n.fvalue != 0 || n.ivalue != 0);
    if (is_float_like(n.dtype)) return fconst(t, n.fvalue);
    return iconst(t, n.ivalue);
  }

  Value* reduce_init(const KernelNode& n) {
    Type* t = compute_type(n.dtype);
    bool fl = is_float_like(n.dtype);
    unsigned bits = fl ? 0 : t->getIntegerBitWidth();
    bool un = is_unsigned_like(n.dtype);
    switch (n.reduce) {
      case KernelReduce::Sum: return fl ? fconst(t, 0) : iconst(t, 0);
      case KernelReduce::Prod: return fl ? fconst(t, 1) : iconst(t, 1);
      case KernelReduce::Max:
        if (fl) return fconst(t, -HUGE_VAL);
        return llvm::ConstantInt::get(t, un ? llvm::APInt::getMinValue(bits) : llvm::APInt::getSignedMinValue(bits));
      case KernelReduce::Min:
        if (fl) return fconst(t, HUGE_VAL);
        return llvm::ConstantInt::get(t, un ? llvm::APInt::getMaxValue(bits) : llvm::APInt::getSignedMaxValue(bits));
    }
    return nullptr;
  }
  Value* reduce_step(const KernelNode& n, Value* acc, Value* x) {
    bool fl = is_float_like(n.dtype), bl = n.dtype == DType::bool_;
    llvm::IRBuilderBase::FastMathFlagGuard guard(b_);
    llvm::FastMathFlags fmf;
    fmf.setAllowContract(true);
    fmf.setAllowReassoc(true);  // lets the vectorizer keep one partial sum per lane
    b_.setFastMathFlags(fmf);
    switch (n.reduce) {
      case KernelReduce::Sum: return fl ? b_.CreateFAdd(acc, x) : bl ? b_.CreateOr(acc, x) : b_.CreateAdd(acc, x);
      case KernelReduce::Prod: return fl ? b_.CreateFMul(acc, x) : bl ? b_.CreateAnd(acc, x) : b_.CreateMul(acc, x);
      case KernelReduce::Max: return max_of(acc, x, n.dtype);
      case KernelReduce::Min: return min_of(acc, x, n.dtype);
    }
    return nullptr;
  }

  // ---- node evaluation ----
  // A row-level value where full-level values are computed (splat across the lanes).
  llvm::Align elem_align(Type* elem) const { return m_.getDataLayout().getABITypeAlign(elem); }
  Value* at_full_level(Value* v) { return lanes_ > 1 ? b_.CreateVectorSplat(unsigned(lanes_), v) : v; }
  Value* row_value(int i) { return at_full_level(row_vals_.at(i)); }

  Value* node_value(int i, int pass) {
    const KernelNode& n = spec_.nodes[size_t(i)];
    if (n.row_level) return row_value(i);
    if (auto it = full_vals_.find(i); it != full_vals_.end()) return it->second;
    Value* v;
    if (n.op == Op::Load) {
      const KernelInput& in = spec_.inputs[size_t(n.input)];
      Type* elem = storage_type(in.dtype);
      Value* p = b_.CreateInBoundsGEP(elem, in_ptr_[size_t(n.input)], b_.CreateAdd(in_off_[size_t(n.input)], col_));
      v = from_storage(b_.CreateAlignedLoad(lanes_of(elem), p, elem_align(elem)), in.dtype);
    } else if (n.pass < pass) {
      Type* elem = compute_type(n.dtype);
      v = b_.CreateAlignedLoad(lanes_of(elem), scratch_ptr(i), elem_align(elem));
    } else {
      v = compute(i, pass);
    }
    full_vals_[i] = v;
    return v;
  }
  Value* scratch_ptr(int i) {
    int slot = spec_.scratch_slot[size_t(i)];
    Value* base =
        b_.CreateInBoundsGEP(b_.getInt8Ty(), scratch_, b_.getInt64(uint64_t(slot) * uint64_t(spec_.cols) * 8));
    return b_.CreateInBoundsGEP(compute_type(spec_.nodes[size_t(i)].dtype), base, col_);
  }
  Value* compute(int i, int pass) {
    const KernelNode& n = spec_.nodes[size_t(i)];
    std::vector<Value*> a;
    for (int k : n.args) a.push_back(node_value(k, pass));
    auto arg_dtype = [&](size_t k) { return spec_.nodes[size_t(n.args[k])].dtype; };
    switch (n.op) {
      case Op::Const: return constant(n);
      case Op::Scalar:
        if (n.scalar_op == ScalarOp::Div && !n.row_level)
          if (auto it = row_recips_.find(n.args[1]); it != row_recips_.end())
            return round_to(b_.CreateFMul(a[0], at_full_level(it->second)), n.dtype);
        return round_to(scalar(n.scalar_op, arg_dtype(0), a), n.dtype);
      case Op::Convert: return round_to(convert(a[0], arg_dtype(0), n.dtype), n.dtype);
      case Op::IntegerPow: return round_to(integer_pow(a[0], n.ivalue, n.dtype), n.dtype);
      case Op::Select: {
        if (arg_dtype(0) == DType::bool_) return b_.CreateSelect(a[0], a[2], a[1]);
        size_t ncases = a.size() - 1;
        Value* r = a[1];
        for (size_t k = 1; k < ncases; ++k) {
          // Out-of-range predicates clamp to the first/last case, as the eager kernel.
          Value* hit = k + 1 == ncases ? b_.CreateICmpSGE(a[0], iconst(a[0]->getType(), int64_t(k)))
                                       : b_.CreateICmpEQ(a[0], iconst(a[0]->getType(), int64_t(k)));
          r = b_.CreateSelect(hit, a[k + 1], r);
        }
        return r;
      }
      default: throw Error("internal: unexpected kernel node");
    }
  }

  void set_row_value(int i, Value* v) {
    row_vals_[i] = v;
    if (divides_full_values(i)) row_recips_[i] = b_.CreateFDiv(llvm::ConstantFP::get(v->getType(), 1.0), v);
  }
  bool divides_full_values(int row_node) const {
    const KernelNode& r = spec_.nodes[size_t(row_node)];
    if (!is_floating(compute_dtype(r.dtype))) return false;
    for (const KernelNode& n : spec_.nodes)
      if (n.op == Op::Scalar && n.scalar_op == ScalarOp::Div && !n.row_level && n.args[1] == row_node) return true;
    return false;
  }

  // Row-level nodes become available between passes; compute those available at `pass`.
  void emit_row_nodes(int pass) {
    for (size_t i = 0; i < spec_.nodes.size(); ++i) {
      const KernelNode& n = spec_.nodes[i];
      if (!n.row_level || n.op == Op::Reduce || n.pass != pass || row_vals_.count(int(i))) continue;
      Value* v;
      if (n.op == Op::Load) {
        const KernelInput& in = spec_.inputs[size_t(n.input)];
        v = from_storage(b_.CreateLoad(storage_type(in.dtype),
                                       b_.CreateInBoundsGEP(storage_type(in.dtype), in_ptr_[size_t(n.input)],
                                                            in_off_[size_t(n.input)])),
                         in.dtype);
      } else {
        full_vals_.clear();
        // Row nodes only read row nodes: compute() takes them from row_vals_.
        v = compute(int(i), pass);
      }
      set_row_value(int(i), v);
    }
  }

  // for (iv = begin; iv < end; ++iv) { body(iv) } with loop-carried values; returns their final values.
  std::vector<Value*> counted_loop(Value* begin, Value* end, std::vector<Value*> init, const char* name,
                                   const std::function<std::vector<Value*>(Value*, const std::vector<Value*>&)>& body,
                                   int64_t step = 1, int interleave = 0) {
    llvm::Function* f = b_.GetInsertBlock()->getParent();
    llvm::BasicBlock* pre = b_.GetInsertBlock();
    auto* loop = llvm::BasicBlock::Create(ctx_, std::string(name) + ".loop", f);
    auto* exit = llvm::BasicBlock::Create(ctx_, std::string(name) + ".exit", f);
    b_.CreateCondBr(b_.CreateICmpSLT(begin, end), loop, exit);
    b_.SetInsertPoint(loop);
    llvm::PHINode* iv = b_.CreatePHI(b_.getInt64Ty(), 2, name);
    iv->addIncoming(begin, pre);
    std::vector<llvm::PHINode*> carried;
    std::vector<Value*> cur;
    for (Value* v : init) {
      carried.push_back(b_.CreatePHI(v->getType(), 2));
      carried.back()->addIncoming(v, pre);
      cur.push_back(carried.back());
    }
    std::vector<Value*> next = body(iv, cur);
    Value* iv_next = b_.CreateAdd(iv, b_.getInt64(uint64_t(step)), "", true, true);
    llvm::BasicBlock* latch = b_.GetInsertBlock();
    iv->addIncoming(iv_next, latch);
    for (size_t k = 0; k < carried.size(); ++k) carried[k]->addIncoming(next[k], latch);
    llvm::BranchInst* back = b_.CreateCondBr(b_.CreateICmpSLT(iv_next, end), loop, exit);
    if (interleave > 0) {
      llvm::Metadata* ic[] = {llvm::MDString::get(ctx_, "llvm.loop.interleave.count"),
                              llvm::ConstantAsMetadata::get(b_.getInt32(uint32_t(interleave)))};
      llvm::MDNode* self = llvm::MDNode::getDistinct(ctx_, {nullptr, llvm::MDNode::get(ctx_, ic)});
      self->replaceOperandWith(0, self);
      back->setMetadata(llvm::LLVMContext::MD_loop, self);
    }
    b_.SetInsertPoint(exit);
    std::vector<Value*> out;
    for (size_t k = 0; k < carried.size(); ++k) {
      llvm::PHINode* phi = b_.CreatePHI(init[k]->getType(), 2);
      phi->addIncoming(init[k], pre);
      phi->addIncoming(next[k], latch);
      out.push_back(phi);
    }
    return out;
  }

  // One column (lanes_ columns from c in a streaming pass) of `pass`: its full-level nodes,
  // scratch stores, reduction steps (returned) and the full outputs available in this pass.
  std::vector<Value*> emit_column(int pass, Value* c, const std::vector<int>& reduces, const std::vector<Value*>& cur,
                                  Value* row_base) {
    col_ = c;
    full_vals_.clear();
    for (size_t i = 0; i < spec_.nodes.size(); ++i) {
      const KernelNode& n = spec_.nodes[i];
      if (n.row_level || n.pass != pass || n.op == Op::Load) continue;
      Value* v = node_value(int(i), pass);
      if (spec_.scratch_slot[i] >= 0) b_.CreateAlignedStore(v, scratch_ptr(int(i)), elem_align(compute_type(n.dtype)));
    }
    std::vector<Value*> next;
    for (size_t k = 0; k < reduces.size(); ++k) {
      const KernelNode& n = spec_.nodes[size_t(reduces[k])];
      next.push_back(reduce_step(n, cur[k], node_value(n.args[0], pass)));
    }
    for (size_t o = 0; o < spec_.outputs.size(); ++o) {
      const KernelOutput& out = spec_.outputs[o];
      if (!stored_in_pass(out, pass)) continue;
      const KernelNode& n = spec_.nodes[size_t(out.node)];
      Value* v = n.row_level ? row_value(out.node) : node_value(out.node, pass);
      // In place: the very address expression of the input's load (equal by layout), so
      // LLVM sees a same-iteration dependence and vectorizes without run-time overlap checks.
      Value* index =
          out.in_place_of >= 0 ? b_.CreateAdd(in_off_[size_t(out.in_place_of)], c) : b_.CreateAdd(row_base, c);
      Type* elem = storage_type(out.dtype);
      Value* p = b_.CreateInBoundsGEP(elem, out_ptr_[o], index);
      llvm::StoreInst* st = b_.CreateAlignedStore(to_storage(v, out.dtype), p, elem_align(elem));
      if (streaming_) {  // whole aligned vectors (emit_streaming_columns): a streaming store
        st->setAlignment(llvm::Align(std::min<uint64_t>(64, uint64_t(lanes_) * elem_align(elem).value())));
        st->setMetadata(llvm::LLVMContext::MD_nontemporal,
                        llvm::MDNode::get(ctx_, llvm::ConstantAsMetadata::get(b_.getInt32(1))));
      }
    }
    return next;
  }
  // A pass whose work is a float max/min reduction and cheap elementwise ops (softmax's first
  // pass). llvm.maximum lowers to a dependent chain of ~5 instructions per vector, so the loop is
  // latency-bound at the vectorizer's default of 4 accumulators; 8 halve its time (row max of
  // f32[512,4096] in cache: 0.032 -> 0.023 ns per element). Passes with transcendentals keep
  // the default: 8 copies of an exp spill registers.
  bool minmax_only_pass(int pass) const {
    bool minmax = false;
    for (const KernelNode& n : spec_.nodes) {
      if (n.pass != pass || (n.row_level && n.op != Op::Reduce)) continue;
      if (n.op == Op::Reduce && is_floating(n.dtype) &&
          (n.reduce == KernelReduce::Max || n.reduce == KernelReduce::Min))
        minmax = true;
      if (n.op == Op::Scalar && libm_name(n.scalar_op)) return false;  // a transcendental
    }
    return minmax;
  }
  // A pass with an inline transcendental (tanh, logistic, log, erf, ...): its ~40-op polynomial
  // chains leave the loop latency-bound when the vectorizer, counting live constants, keeps one
  // vector per iteration; four independent vectors per iteration fill the pipelines (f32
  // [2048,512] on AVX2 Zen 3: tanh-GELU 1.25 -> 0.85 ms, its gradient 1.4 -> 0.95 ms, sigmoid
  // 0.9 -> 0.6 ms, erf-GELU 3.4-4.4 -> 2.5 ms; 8 copies were no faster). Only passes without
  // reductions: their results are the same bits at any interleave, while a reduction's order
  // (and so its rounding) would follow the count. Rows shorter than 4 of the widest vectors
  // (AVX-512: 64 f32) keep the default, which vectorizes them without a long scalar remainder.
  bool transcendental_pass(int pass) const {
    if (spec_.cols < 4 * kVectorLanes) return false;
    for (const KernelNode& n : spec_.nodes)
      if (n.pass == pass && !n.row_level && n.op == Op::Scalar && libm_name(n.scalar_op)) return true;
    return false;
  }
  bool stored_in_pass(const KernelOutput& out, int pass) const {
    const KernelNode& n = spec_.nodes[size_t(out.node)];
    return out.full && (n.op == Op::Reduce ? n.pass + 1 : n.pass) == pass;
  }

  // ---- streaming stores ----
  // A kernel that writes more than kStreamingBytes of fresh output (more than this machine's
  // last-level cache can keep for the consumer) stores it with non-temporal stores: they skip
  // the read-for-ownership of every written cache line, a third of the memory traffic of a
  // read-one-write-one kernel (a row softmax of f32[4096, 4096]: 192 -> 128 MB). LLVM's loop
  // vectorizer does not widen non-temporal scalar stores, so such passes are emitted as explicit
  // vector code: a scalar head up to the first 16-aligned column, a loop over whole aligned
  // vectors of 16 lanes, and a scalar tail. Per-element results are those of the scalar code
  // (the same IR per lane). Passes with reductions, in-place outputs or libm calls stay scalar.
  static constexpr int kVectorLanes = 16;
  static constexpr int64_t kStreamingBytes = int64_t(16) << 20;

  // Whether `pass`, which has no reductions, is emitted with streaming stores.
  bool streams_pass(int pass) {
    int64_t bytes = 0;
    bool writes = false;
    for (const KernelOutput& out : spec_.outputs) {
      if (out.in_place_of >= 0) return false;
      if (out.full) bytes += spec_.rows() * spec_.cols * int64_t(itemsize(out.dtype));
      writes = writes || stored_in_pass(out, pass);
    }
    if (!writes || bytes < kStreamingBytes) return false;
    // A pass with an inline transcendental is bound by its arithmetic, not by memory: it keeps
    // the vectorizer's loop with four vectors in flight (transcendental_pass), which the
    // one-vector streaming loop lacks (10-op chain with tanh and logistic on f32[16M], AVX-512
    // Zen 5, 2 threads: 11.2-12.2 ms streamed, 6.3-7.1 ms not).
    if (transcendental_pass(pass)) return false;
    for (const KernelNode& n : spec_.nodes) {
      if (n.row_level || n.pass != pass) continue;
      if (n.op == Op::Scalar && calls_libm(n.scalar_op, spec_.nodes[size_t(n.args[0])].dtype)) return false;
    }
    return true;
  }

  // The whole aligned vectors [vb, ve) of columns [cb, ce) of the row at row_base: output bases
  // are 64-byte aligned (the allocator's alignment); checked, else all scalar (vb = ve = ce).
  std::pair<Value*, Value*> streaming_range(Value* cb, Value* ce, Value* row_base) {
    Type* i64 = b_.getInt64Ty();
    Value* aligned = b_.getTrue();
    for (size_t o = 0; o < spec_.outputs.size(); ++o)
      if (spec_.outputs[o].full)
        aligned = b_.CreateAnd(aligned,
                               b_.CreateICmpEQ(b_.CreateAnd(b_.CreatePtrToInt(out_ptr_[o], i64), 63), b_.getInt64(0)));
    Value* lanes = b_.getInt64(kVectorLanes);
    Value* first = b_.CreateAdd(row_base, cb);
    Value* head = b_.CreateURem(b_.CreateSub(lanes, b_.CreateURem(first, lanes)), lanes);
    Value* vb = b_.CreateSelect(aligned, intrinsic(llvm::Intrinsic::smin, {ce, b_.CreateAdd(cb, head)}), ce);
    Value* ve = b_.CreateAdd(vb, b_.CreateMul(b_.CreateSDiv(b_.CreateSub(ce, vb), lanes), lanes));
    return {vb, ve};
  }
  // In a later pass of a multi-pass kernel (softmax's normalization), the row's inputs are in
  // cache and memory would sit idle: fetch the inputs of a row ahead, a cache line per vector,
  // so that a row's first pass finds its data in cache, requested a whole row's time earlier
  // (row softmax of f32[4096,4096]: -20% with the next row, another -5% with the row after;
  // fetching during the exp pass instead was slower). A prefetch past the last row is harmless
  // (it never faults).
  void prefetch_row_ahead(Value* c, int rows_ahead) {
    for (size_t i = 0; i < spec_.inputs.size(); ++i) {
      const KernelInput& in = spec_.inputs[i];
      int64_t ahead = rows_ahead * in.outer_strides.back();
      if (in.col_stride != 1 || ahead == 0) continue;
      Value* at = b_.CreateAdd(b_.CreateAdd(in_off_[i], b_.getInt64(uint64_t(ahead))), c);
      Value* p = b_.CreateGEP(storage_type(in.dtype), in_ptr_[i], at);
      b_.CreateIntrinsic(llvm::Intrinsic::prefetch, {p->getType()},
                         {p, b_.getInt32(0), b_.getInt32(3), b_.getInt32(1)});
    }
  }

  void emit_streaming_columns(int pass, Value* cb, Value* ce, Value* row_base) {
    auto column = [&](Value* c, const std::vector<Value*>&) { return emit_column(pass, c, {}, {}, row_base); };
    auto [vb, ve] = streaming_range(cb, ce, row_base);
    counted_loop(cb, vb, {}, "col.head", column);
    lanes_ = kVectorLanes;
    counted_loop(
        vb, ve, {}, "col.stream",
        [&](Value* c, const std::vector<Value*>&) {
          stream_vector(pass, c, row_base, pass > 0 && !spec_.outer.empty() ? 2 : 0);
          return std::vector<Value*>{};
        },
        kVectorLanes);
    lanes_ = 1;
    counted_loop(ve, ce, {}, "col.tail", column);
    streamed_ = true;
  }
  // One aligned vector of columns from c of streaming pass `pass`, then a prefetch of the inputs
  // `rows_ahead` rows ahead (none: 0).
  void stream_vector(int pass, Value* c, Value* row_base, int rows_ahead) {
    streaming_ = true;
    emit_column(pass, c, {}, {}, row_base);
    if (rows_ahead > 0) prefetch_row_ahead(c, rows_ahead);
    streaming_ = false;
  }

  // ---- explicit vector passes ----
  // A pass that computes an f32 exp (softmax's exp-and-sum, attention's probabilities) is emitted
  // as explicit vector code too: a loop over whole vectors of kVectorLanes columns, reductions in
  // vector accumulators combined by a fixed tree at the end, then a scalar tail. In vector code
  // exp branches over its special cases instead of selecting (llvm_math.h): ~16 ops per vector
  // instead of ~25, and without the vectorizer's four interleaved copies the exp's constants
  // stay in registers. Results per element are the scalar code's; a reduction's combine order is
  // fixed by the code, so it is deterministic run to run.
  bool vector_pass(int pass) {
    if (spec_.cols < 4 * kVectorLanes) return false;
    bool exp = false;
    for (const KernelNode& n : spec_.nodes) {
      if (n.row_level || n.pass != pass || n.op != Op::Scalar) continue;
      DType in = spec_.nodes[size_t(n.args[0])].dtype;
      if (calls_libm(n.scalar_op, in)) return false;
      exp = exp || (n.scalar_op == ScalarOp::Exp && compute_type(compute_dtype(in))->isFloatTy());
    }
    return exp;
  }
  // Combines the lanes of a vector accumulator of reduction `n`: halves, then quarters, ...
  Value* combine_lanes(const KernelNode& n, Value* v) {
    for (unsigned w = unsigned(kVectorLanes); w > 1; w /= 2) {
      std::vector<int> lo(w / 2), hi(w / 2);
      for (unsigned i = 0; i < w / 2; ++i) lo[i] = int(i), hi[i] = int(i + w / 2);
      v = reduce_step(n, b_.CreateShuffleVector(v, lo), b_.CreateShuffleVector(v, hi));
    }
    return b_.CreateExtractElement(v, uint64_t(0));
  }
  // Vector accumulators are summed in blocks: every kBlockVectors vectors, a reduction's
  // accumulator is folded into a running total and restarts, so a long row's sum adds up
  // 64-element partial sums per lane instead of every element (a row of 4M: 1e-6 relative error
  // instead of 4e-4). The loop-carried values are the accumulators, then the totals.
  static constexpr int64_t kBlockVectors = 64;
  std::vector<Value*> vector_init(const std::vector<Value*>& init) {
    std::vector<Value*> v;
    for (int twice = 0; twice < 2; ++twice)
      for (Value* x : init) v.push_back(b_.CreateVectorSplat(unsigned(kVectorLanes), x));
    return v;
  }
  std::vector<Value*> vector_column(int pass, Value* c, Value* cb, const std::vector<int>& reduces,
                                    const std::vector<Value*>& cur, Value* row_base) {
    size_t k = reduces.size();
    std::vector<Value*> acc = emit_column(pass, c, reduces, {cur.begin(), cur.begin() + long(k)}, row_base);
    if (k == 0) return acc;
    const int64_t block = kBlockVectors * kVectorLanes;
    Value* at_end =
        b_.CreateICmpEQ(b_.CreateAnd(b_.CreateSub(c, cb), b_.getInt64(block - 1)), b_.getInt64(block - kVectorLanes));
    llvm::BasicBlock* from = b_.GetInsertBlock();
    auto* fold = llvm::BasicBlock::Create(ctx_, "block.fold", body_);
    auto* join = llvm::BasicBlock::Create(ctx_, "block.join", body_);
    b_.CreateCondBr(at_end, fold, join);
    b_.SetInsertPoint(fold);
    std::vector<Value*> folded;
    for (size_t i = 0; i < k; ++i) folded.push_back(reduce_step(spec_.nodes[size_t(reduces[i])], cur[k + i], acc[i]));
    b_.CreateBr(join);
    b_.SetInsertPoint(join);
    std::vector<Value*> next(2 * k);
    for (size_t i = 0; i < k; ++i) {
      llvm::PHINode* a = b_.CreatePHI(acc[i]->getType(), 2);
      a->addIncoming(acc[i], from);
      a->addIncoming(b_.CreateVectorSplat(unsigned(kVectorLanes), reduce_init(spec_.nodes[size_t(reduces[i])])), fold);
      llvm::PHINode* t = b_.CreatePHI(acc[i]->getType(), 2);
      t->addIncoming(cur[k + i], from);
      t->addIncoming(folded[i], fold);
      next[i] = a, next[k + i] = t;
    }
    return next;
  }
  // The scalar accumulators a vector loop ends with: each total with its last block, lanes combined.
  std::vector<Value*> vector_result(const std::vector<int>& reduces, const std::vector<Value*>& vacc) {
    std::vector<Value*> acc;
    size_t k = reduces.size();
    for (size_t i = 0; i < k; ++i) {
      const KernelNode& n = spec_.nodes[size_t(reduces[i])];
      acc.push_back(combine_lanes(n, reduce_step(n, vacc[k + i], vacc[i])));
    }
    return acc;
  }
  // With a guest, the vectors from cb to guest_end also emit guest(c) (pipelined rows below).
  using Guest = std::function<void(Value*)>;
  std::vector<Value*> emit_vector_columns(int pass, Value* cb, Value* ce, const std::vector<int>& reduces,
                                          const std::vector<Value*>& init, Value* row_base,
                                          const Guest& guest = nullptr, Value* guest_end = nullptr) {
    Value* lanes = b_.getInt64(kVectorLanes);
    Value* ve = b_.CreateAdd(cb, b_.CreateMul(b_.CreateSDiv(b_.CreateSub(ce, cb), lanes), lanes));
    lanes_ = kVectorLanes;
    std::vector<Value*> vacc = vector_init(init);
    Value* own_begin = cb;
    if (guest) {
      vacc = counted_loop(
          cb, guest_end, vacc, "col.fused",
          [&](Value* c, const std::vector<Value*>& cur) {
            std::vector<Value*> next = vector_column(pass, c, cb, reduces, cur, row_base);
            guest(c);
            return next;
          },
          kVectorLanes);
      own_begin = guest_end;
    }
    vacc = counted_loop(
        own_begin, ve, vacc, "col.vec",
        [&](Value* c, const std::vector<Value*>& cur) { return vector_column(pass, c, cb, reduces, cur, row_base); },
        kVectorLanes);
    lanes_ = 1;
    return counted_loop(ve, ce, vector_result(reduces, vacc), "col.tail",
                        [&](Value* c, const std::vector<Value*>& cur) {
                          return emit_column(pass, c, reduces, cur, row_base);
                        });
  }

  // ---- rows ----
  // The state the column code reads for one row. The pipelined schedule below swaps a previous
  // row's state in to emit that row's last pass inside a pass of the current row.
  struct RowState {
    Value* row = nullptr;
    Value* base = nullptr;     // row * C: the row's first element in full outputs
    Value* scratch = nullptr;  // the row's set of scratch rows
    std::vector<Value*> in_off;
    std::unordered_map<int, Value*> vals, recips;
  };
  Value* scratch_root_ = nullptr;
  Value* row_base_ = nullptr;
  void swap_row(RowState& r) {
    std::swap(row_, r.row);
    std::swap(row_base_, r.base);
    std::swap(scratch_, r.scratch);
    std::swap(in_off_, r.in_off);
    std::swap(row_vals_, r.vals);
    std::swap(row_recips_, r.recips);
  }
  std::vector<Value*> input_offsets(Value* row) {
    std::vector<Value*> idx(spec_.outer.size()), off;
    int64_t inner = 1;
    for (size_t d = spec_.outer.size(); d-- > 0;) {
      Value* q = inner == 1 ? row : b_.CreateUDiv(row, b_.getInt64(uint64_t(inner)));
      idx[d] = d == 0 ? q : b_.CreateURem(q, b_.getInt64(uint64_t(spec_.outer[d])));
      inner *= spec_.outer[d];
    }
    for (const KernelInput& in : spec_.inputs) {
      Value* o = b_.getInt64(0);
      for (size_t d = 0; d < idx.size(); ++d)
        if (in.outer_strides[d] != 0)
          o = b_.CreateAdd(o, b_.CreateMul(idx[d], b_.getInt64(uint64_t(in.outer_strides[d]))));
      off.push_back(o);
    }
    return off;
  }
  // A row's state with no row values yet; pipelined kernels alternate scratch sets by row parity.
  RowState row_state(Value* row) {
    RowState r;
    r.row = row;
    r.base = b_.CreateMul(row, b_.getInt64(uint64_t(spec_.cols)));
    r.scratch = scratch_root_;
    if (fused_pass_ >= 0)
      r.scratch = b_.CreateInBoundsGEP(b_.getInt8Ty(), scratch_root_,
                                       b_.CreateMul(b_.CreateAnd(row, b_.getInt64(1)),
                                                    b_.getInt64(uint64_t(spec_.scratch_bytes() / 2))));
    r.in_off = input_offsets(row);
    return r;
  }
  void begin_row(Value* row) {
    RowState r = row_state(row);
    swap_row(r);
  }

  std::vector<int> reductions_of(int pass) const {
    std::vector<int> out;
    for (size_t i = 0; i < spec_.nodes.size(); ++i)
      if (spec_.nodes[i].op == Op::Reduce && spec_.nodes[i].pass == pass) out.push_back(int(i));
    return out;
  }
  std::vector<Value*> reduce_inits(const std::vector<int>& reduces) {
    std::vector<Value*> init;
    for (int r : reduces) init.push_back(reduce_init(spec_.nodes[size_t(r)]));
    return init;
  }
  void finish_reductions(const std::vector<int>& reduces, const std::vector<Value*>& acc) {
    for (size_t k = 0; k < reduces.size(); ++k)
      set_row_value(reduces[k], round_to(acc[k], spec_.nodes[size_t(reduces[k])].dtype));
  }

  // One pass over the columns [cb, ce) of the current row; with `prev`, a vector pass that also
  // runs the last pass of that previous row (pipelined rows, below).
  void run_pass(int pass, Value* cb, Value* ce, RowState* prev = nullptr) {
    emit_row_nodes(pass);
    std::vector<int> reduces = reductions_of(pass);
    std::vector<Value*> init = reduce_inits(reduces), acc;
    Value* row_base = row_base_;
    if (prev) {
      acc = emit_hosting_columns(pass, *prev, cb, ce, reduces, init);
    } else if (reduces.empty() && streams_pass(pass)) {
      emit_streaming_columns(pass, cb, ce, row_base);
    } else if (vector_pass(pass)) {
      acc = emit_vector_columns(pass, cb, ce, reduces, init, row_base);
    } else {
      acc = counted_loop(
          cb, ce, init, "col",
          [&](Value* c, const std::vector<Value*>& cur) { return emit_column(pass, c, reduces, cur, row_base); }, 1,
          minmax_only_pass(pass) ? 8 : (reduces.empty() && transcendental_pass(pass) ? 4 : 0));
    }
    finish_reductions(reduces, acc);
  }
  // Row values computed after the last pass, and the row-level outputs.
  void finish_row() {
    emit_row_nodes(spec_.num_passes);
    for (size_t o = 0; o < spec_.outputs.size(); ++o) {
      const KernelOutput& out = spec_.outputs[o];
      if (out.full) continue;
      Value* p = b_.CreateInBoundsGEP(storage_type(out.dtype), out_ptr_[o], row_);
      b_.CreateStore(to_storage(row_vals_.at(out.node), out.dtype), p);
    }
  }

  // ---- pipelined rows ----
  // A kernel whose last pass streams its output (a big softmax: normalize and store) and has an
  // earlier vector pass (softmax's exp-and-sum) runs rows skewed: row r's vector pass and row
  // r-1's last pass share one loop, so the streaming stores drain while exps are computed
  // instead of after them (row softmax of f32[4096,4096]: 2.72-2.78 -> 2.18-2.25 ms at this
  // machine's usual ~45 GB/s STREAM copy, where memory is the limit).
  // Scratch sets alternate by row parity, row r-1's row values are carried in the row loop, and
  // the last row's last pass runs after it. Every element is computed by the same code as in
  // the plain schedule, and reductions keep their order: results are bit-identical.
  int fused_pass_ = -1;  // the vector pass that hosts the previous row's last pass, or -1
  int pipelined_pass() {
    const int last = spec_.num_passes - 1;
    if (last < 1 || spec_.outer.empty() || !reductions_of(last).empty() || !streams_pass(last)) return -1;
    for (int p = last - 1; p >= 0; --p)
      if (vector_pass(p)) return p;
    return -1;
  }
  // The carried row values: (node, is a reciprocal) in a fixed order.
  std::vector<std::pair<int, bool>> carried_;
  std::vector<Value*> pack_row() {
    if (carried_.empty()) {
      for (auto& [k, v] : row_vals_) carried_.push_back({k, false});
      for (auto& [k, v] : row_recips_) carried_.push_back({k, true});
      std::sort(carried_.begin(), carried_.end());
    }
    std::vector<Value*> out;
    for (auto [k, recip] : carried_) out.push_back((recip ? row_recips_ : row_vals_).at(k));
    return out;
  }
  RowState unpack_row(Value* row, const std::vector<Value*>& vals) {
    RowState r = row_state(row);
    for (size_t i = 0; i < carried_.size(); ++i) (carried_[i].second ? r.recips : r.vals)[carried_[i].first] = vals[i];
    return r;
  }

  // Vector pass `pass` of the current row with the last pass of `prev` in its loop: prev's scalar
  // head, one vector of each per iteration while prev has aligned vectors, prev's scalar tail.
  std::vector<Value*> emit_hosting_columns(int pass, RowState& prev, Value* cb, Value* ce,
                                           const std::vector<int>& reduces, const std::vector<Value*>& init) {
    const int last = spec_.num_passes - 1;
    Value* row_base = row_base_;
    auto prev_columns = [&](Value* c, const std::vector<Value*>&) { return emit_column(last, c, {}, {}, row_base_); };
    swap_row(prev);
    auto [vb, ve] = streaming_range(cb, ce, row_base_);
    counted_loop(cb, vb, {}, "prev.head", prev_columns);
    swap_row(prev);
    auto guest = [&](Value* c) {
      swap_row(prev);
      stream_vector(last, b_.CreateAdd(vb, b_.CreateSub(c, cb)), row_base_, 3);  // 3: the row after this one
      swap_row(prev);
    };
    std::vector<Value*> acc =
        emit_vector_columns(pass, cb, ce, reduces, init, row_base, guest, b_.CreateAdd(cb, b_.CreateSub(ve, vb)));
    swap_row(prev);
    counted_loop(ve, ce, {}, "prev.tail", prev_columns);
    swap_row(prev);
    streamed_ = true;
    return acc;
  }

  void emit_pipelined_rows(Value* rb, Value* re, Value* cb, Value* ce) {
    const int last = spec_.num_passes - 1;
    auto* rows = llvm::BasicBlock::Create(ctx_, "rows", body_);
    auto* done = llvm::BasicBlock::Create(ctx_, "rows.done", body_);
    b_.CreateCondBr(b_.CreateICmpSLT(rb, re), rows, done);
    b_.SetInsertPoint(rows);
    auto all_but_last = [&](Value* row, RowState* prev) {
      begin_row(row);
      for (int pass = 0; pass < last; ++pass) {
        run_pass(pass, cb, ce, pass == fused_pass_ ? prev : nullptr);
      }
      emit_row_nodes(last);
      finish_row();
      return pack_row();
    };
    std::vector<Value*> first = all_but_last(rb, nullptr);
    std::vector<Value*> final_vals = counted_loop(b_.CreateAdd(rb, b_.getInt64(1)), re, first, "row.pipe",
                                                  [&](Value* row, const std::vector<Value*>& cur) {
                                                    RowState prev = unpack_row(b_.CreateSub(row, b_.getInt64(1)), cur);
                                                    return all_but_last(row, &prev);
                                                  });
    RowState last_row = unpack_row(b_.CreateSub(re, b_.getInt64(1)), final_vals);
    swap_row(last_row);
    run_pass(last, cb, ce);
    b_.CreateBr(done);
    b_.SetInsertPoint(done);
  }

  void emit_body(size_t nbuf) {
    b_.SetInsertPoint(llvm::BasicBlock::Create(ctx_, "entry", body_));
    size_t nin = spec_.inputs.size();
    for (size_t i = 0; i < nin; ++i) in_ptr_.push_back(body_->getArg(unsigned(i)));
    for (size_t i = nin; i < nbuf; ++i) {
      int alias = spec_.outputs[i - nin].in_place_of;
      out_ptr_.push_back(alias >= 0 ? in_ptr_[size_t(alias)] : body_->getArg(unsigned(i)));
    }
    scratch_root_ = body_->getArg(unsigned(nbuf));
    Value* rb = body_->getArg(unsigned(nbuf + 1));
    Value* re = body_->getArg(unsigned(nbuf + 2));
    Value* cb = body_->getArg(unsigned(nbuf + 3));
    Value* ce = body_->getArg(unsigned(nbuf + 4));
    fused_pass_ = pipelined_pass();
    if (fused_pass_ >= 0) {
      emit_pipelined_rows(rb, re, cb, ce);
    } else {
      counted_loop(rb, re, {}, "row", [&](Value* row, const std::vector<Value*>&) {
        begin_row(row);
        for (int pass = 0; pass < spec_.num_passes; ++pass) run_pass(pass, cb, ce);
        finish_row();
        return std::vector<Value*>{};
      });
    }
    // Streaming stores are weakly ordered: fence them before the caller signals completion.
    if (streamed_) b_.CreateFence(llvm::AtomicOrdering::SequentiallyConsistent);
    b_.CreateRetVoid();
  }
};

}  // namespace

namespace {
constexpr size_t kKernelsPerModule = 4, kMaxModules = 8;
}  // namespace

CompiledKernels compile_kernels(std::span<const KernelSpec* const> specs, std::string* ir_out) {
  auto t0 = std::chrono::steady_clock::now();
  // Kernels with equal canonical text compile to the same machine code: emit each distinct one
  // once and point its duplicates at it (a training step repeats the same SGD update, bias-grad
  // reduction and activation kernels per layer; this roughly halves LLVM's time).
  std::vector<size_t> emitted_as(specs.size());
  std::vector<const KernelSpec*> distinct;
  {
    absl::flat_hash_map<std::string, size_t> first_of;
    for (size_t i = 0; i < specs.size(); ++i) {
      auto [it, inserted] = first_of.try_emplace(specs[i]->canonical(), distinct.size());
      if (inserted) distinct.push_back(specs[i]);
      emitted_as[i] = it->second;
    }
  }
  // The distinct kernels are split into modules compiled side by side (LLVM is most of a cold
  // compile; one module kept one core busy). The split depends on the kernels only, never on the
  // thread count, so the cache entries (one per module) are the same everywhere: the largest
  // kernels first, each to the least loaded module.
  const size_t parts =
      std::clamp<size_t>((distinct.size() + kKernelsPerModule - 1) / kKernelsPerModule, 1, kMaxModules);
  std::vector<std::vector<size_t>> members(parts);
  {
    std::vector<size_t> size(distinct.size()), order(distinct.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i, size[i] = distinct[i]->canonical().size();
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return size[a] > size[b]; });
    std::vector<size_t> load(parts, 0);
    for (size_t i : order) {
      size_t p = size_t(std::min_element(load.begin(), load.end()) - load.begin());
      members[p].push_back(i);
      load[p] += size[i];
    }
    for (auto& m : members) std::sort(m.begin(), m.end());
  }
  CompiledKernels out;
  std::vector<std::string> keys(parts), irs(parts);
  std::vector<std::unique_ptr<llvm::MemoryBuffer>> objects(parts);
  bool all_cached = true;
  for (size_t p = 0; p < parts; ++p) {
    for (size_t i : members[p]) keys[p] += distinct[i]->name + "\n" + distinct[i]->canonical();
    if (!ir_out) objects[p] = cpu::cached_object(keys[p]);
    all_cached = all_cached && objects[p];
  }
  out.from_cache = all_cached;
  auto compile_part = [&](size_t p) {
    llvm::LLVMContext ctx;
    auto m = std::make_unique<llvm::Module>("cjax_kernels", ctx);
    cpu::configure_for_host(*m);
    for (size_t i : members[p]) KernelEmitter(*m, *distinct[i]).emit();
    std::string err;
    llvm::raw_string_ostream es(err);
    if (llvm::verifyModule(*m, &es)) throw Error(fmt::format("internal: generated LLVM IR is invalid: {}", es.str()));
    llvm::raw_string_ostream os(irs[p]);
    if (ir_out) os << "; ---- before optimization ---- (module " << p << ")\n" << *m;
    objects[p] = cpu::compile_to_object(*m);
    if (ir_out) os << "; ---- after optimization ---- (module " << p << ")\n" << *m;
    cpu::store_object(keys[p], *objects[p]);
  };
  std::vector<std::shared_ptr<cpu::JitCode>> codes(parts);
  std::vector<KernelFn> distinct_fns(distinct.size());
  auto build_part = [&](size_t p) {  // compiled where the cache missed, then linked (ORC links on lookup)
    if (!objects[p]) compile_part(p);
    codes[p] = cpu::link_object(std::move(objects[p]));
    for (size_t i : members[p]) distinct_fns[i] = reinterpret_cast<KernelFn>(codes[p]->lookup(distinct[i]->name));
  };
  // On threads of their own, at most one per core, not on the intra-op pool: the pool runs one
  // job at a time, and other threads' kernels (earlier steps still running, SPMD devices) must
  // not wait for a compilation. All from the cache: linked on the calling thread alone.
  const size_t workers = all_cached ? 1 : std::min(parts, size_t(std::max(1, num_threads())));
  std::atomic<size_t> next{0};
  std::vector<std::exception_ptr> errors(workers);
  auto work = [&](size_t w) {
    try {
      for (size_t p = next++; p < parts; p = next++) build_part(p);
    } catch (...) {
      errors[w] = std::current_exception();
    }
  };
  {
    std::vector<std::thread> helpers;
    for (size_t w = 1; w < workers; ++w) helpers.emplace_back(work, w);
    work(0);
    for (std::thread& t : helpers) t.join();
  }
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
  if (ir_out)
    for (const std::string& ir : irs) *ir_out += ir;
  for (size_t i = 0; i < specs.size(); ++i) out.fns.push_back(distinct_fns[emitted_as[i]]);
  out.code = std::make_shared<std::vector<std::shared_ptr<cpu::JitCode>>>(std::move(codes));
  out.compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace cjax
