// numpy linear algebra: dot, matmul, vdot, inner, outer, tensordot, einsum — all lowered to
// lax.dot_general (+ transpose / reshape / reduce_sum), as jax.numpy does.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <numeric>

#include "cjax/lax.h"
#include "cjax/numpy.h"
#include "core/array/array_impl.h"
#include "core/array/util.h"

namespace cjax::numpy {
namespace {

std::string ints_str(const std::vector<int64_t>& v) { return fmt::format("({})", fmt::join(v, ", ")); }

Array ravel1(const Array& x) {
  if (x.ndim() == 1) return x;
  return lax::reshape(x, {x.size()});
}

// dot_general on promoted operands, recording the result dtype as JAX's jnp functions do.
Array dg(const Array& a, const Array& b, std::vector<int64_t> ca, std::vector<int64_t> cb, std::vector<int64_t> ba = {},
         std::vector<int64_t> bb = {}) {
  lax::DotDimensionNumbers dn{{std::move(ca), std::move(cb)}, {std::move(ba), std::move(bb)}};
  return lax::dot_general(a, b, dn, a.dtype());
}

void check_contract(std::string_view fn, const Array& a, const Array& b, const std::vector<int64_t>& ca,
                    const std::vector<int64_t>& cb) {
  if (ca.size() != cb.size())
    throw ShapeError(fmt::format("{}: {} axes of a {} and {} axes of b {} cannot be contracted pairwise", fn, ca.size(),
                                 ints_str(ca), cb.size(), ints_str(cb)));
  for (size_t i = 0; i < ca.size(); ++i)
    if (a.shape()[size_t(ca[i])] != b.shape()[size_t(cb[i])])
      throw ShapeError(
          fmt::format("{}: shapes {} and {} are not aligned: axis {} of a (size {}) != axis {} of b "
                      "(size {})",
                      fn, shape_str(a.shape()), shape_str(b.shape()), ca[i], a.shape()[size_t(ca[i])], cb[i],
                      b.shape()[size_t(cb[i])]));
}

Array sum_axes(const Array& x, const std::vector<int64_t>& axes) {
  if (axes.empty()) return x;
  if (x.dtype() == DType::bool_) return lax::reduce_or(x, axes);
  return lax::reduce_sum(x, axes);
}

bool is_identity(const std::vector<int64_t>& perm) {
  for (size_t i = 0; i < perm.size(); ++i)
    if (perm[i] != int64_t(i)) return false;
  return true;
}

}  // namespace

Array dot(const Array& a0, const Array& b0) {
  auto ab = promote_dtypes("dot", {a0, b0});
  const Array &a = ab[0], &b = ab[1];
  if (a.ndim() == 0 || b.ndim() == 0) return dg(a, b, {}, {});
  std::vector<int64_t> ca{a.ndim() - 1}, cb{b.ndim() == 1 ? 0 : b.ndim() - 2};
  check_contract("dot", a, b, ca, cb);
  return dg(a, b, ca, cb);
}

Array matmul(const Array& a0, const Array& b0) {
  if (a0.ndim() == 0 || b0.ndim() == 0)
    throw ValueError(
        fmt::format("matmul: operands must be at least 1-D, got shapes {} and {} (use multiply or dot "
                    "for scalars)",
                    shape_str(a0.shape()), shape_str(b0.shape())));
  auto ab = promote_dtypes("matmul", {a0, b0});
  Array a = ab[0], b = ab[1];
  const bool a_mat = a.ndim() > 1, b_mat = b.ndim() > 1;
  int64_t ka = a.shape().back(), kb = b.shape()[size_t(b_mat ? b.ndim() - 2 : 0)];
  if (ka != kb)
    throw ShapeError(fmt::format("matmul: contracting dimensions differ: a {} has {} columns but b {} has {} rows",
                                 shape_str(a.shape()), ka, shape_str(b.shape()), kb));
  // JAX's matmul: match batch dims, squeezing size-1 broadcast dims into the other side's free dims.
  Shape abatch = a_mat ? Shape(a.shape().begin(), a.shape().end() - 2) : Shape{};
  Shape bbatch = b_mat ? Shape(b.shape().begin(), b.shape().end() - 2) : Shape{};
  size_t nb = std::max(abatch.size(), bbatch.size());
  std::vector<int64_t> a_squeeze, b_squeeze, a_batch, b_batch, idx_batch, idx_a, idx_b;
  for (size_t i = 0; i < nb; ++i) {
    bool has_a = i >= nb - abatch.size(), has_b = i >= nb - bbatch.size();
    int64_t da = has_a ? abatch[i - (nb - abatch.size())] : 0, db = has_b ? bbatch[i - (nb - bbatch.size())] : 0;
    int64_t ii = int64_t(i);
    if (!has_a) {
      idx_b.push_back(ii);
    } else if (!has_b) {
      idx_a.push_back(ii);
    } else if (da == 1) {
      idx_b.push_back(ii);
      a_squeeze.push_back(int64_t(idx_batch.size() + idx_a.size() + a_squeeze.size()));
    } else if (db == 1) {
      idx_a.push_back(ii);
      b_squeeze.push_back(int64_t(idx_batch.size() + idx_b.size() + b_squeeze.size()));
    } else if (da == db) {
      a_batch.push_back(int64_t(idx_batch.size() + idx_a.size()));
      b_batch.push_back(int64_t(idx_batch.size() + idx_b.size()));
      idx_batch.push_back(ii);
    } else {
      throw ShapeError(
          fmt::format("matmul: batch dimensions of {} and {} cannot be broadcast together (dimension {} "
                      "vs {})",
                      shape_str(a.shape()), shape_str(b.shape()), da, db));
    }
  }
  if (a_mat) idx_a.push_back(int64_t(nb));
  if (b_mat) idx_b.push_back(int64_t(nb) + (a_mat ? 1 : 0));
  if (!a_squeeze.empty()) a = lax::squeeze(a, a_squeeze);
  if (!b_squeeze.empty()) b = lax::squeeze(b, b_squeeze);
  Array out = dg(a, b, {a.ndim() - 1}, {b.ndim() - 1 - (b_mat ? 1 : 0)}, a_batch, b_batch);
  std::vector<int64_t> order = idx_batch;
  order.insert(order.end(), idx_a.begin(), idx_a.end());
  order.insert(order.end(), idx_b.begin(), idx_b.end());
  std::vector<int64_t> perm(order.size());  // argsort
  std::iota(perm.begin(), perm.end(), 0);
  std::sort(perm.begin(), perm.end(), [&](int64_t x, int64_t y) { return order[size_t(x)] < order[size_t(y)]; });
  if (!is_identity(perm)) out = lax::transpose(out, perm);
  return out;
}

Array vdot(const Array& a, const Array& b) {
  if (a.size() != b.size())
    throw ShapeError(fmt::format("vdot: operands must have the same number of elements, got shapes {} ({}) and {} ({})",
                                 shape_str(a.shape()), a.size(), shape_str(b.shape()), b.size()));
  return dot(ravel1(a), ravel1(b));
}

Array inner(const Array& a0, const Array& b0) {
  auto ab = promote_dtypes("inner", {a0, b0});
  const Array &a = ab[0], &b = ab[1];
  if (a.ndim() == 0 || b.ndim() == 0) return dg(a, b, {}, {});
  std::vector<int64_t> ca{a.ndim() - 1}, cb{b.ndim() - 1};
  check_contract("inner", a, b, ca, cb);
  return dg(a, b, ca, cb);
}

Array outer(const Array& a0, const Array& b0) {
  auto ab = promote_dtypes("outer", {a0, b0});
  return dg(ravel1(ab[0]), ravel1(ab[1]), {}, {});
}

Array tensordot(const Array& a, const Array& b, int64_t axes) {
  if (axes < 0 || axes > a.ndim() || axes > b.ndim())
    throw ValueError(
        fmt::format("tensordot: axes={} must be between 0 and the operand ranks ({} and {}) for shapes "
                    "{} and {}",
                    axes, a.ndim(), b.ndim(), shape_str(a.shape()), shape_str(b.shape())));
  std::vector<int64_t> ca, cb;
  for (int64_t i = 0; i < axes; ++i) {
    ca.push_back(a.ndim() - axes + i);
    cb.push_back(i);
  }
  return tensordot(a, b, {ca, cb});
}

Array tensordot(const Array& a0, const Array& b0, const std::pair<std::vector<int64_t>, std::vector<int64_t>>& axes) {
  auto ab = promote_dtypes("tensordot", {a0, b0});
  const Array &a = ab[0], &b = ab[1];
  auto ca = canonicalize_axes(axes.first, a.ndim(), "tensordot");
  auto cb = canonicalize_axes(axes.second, b.ndim(), "tensordot");
  check_contract("tensordot", a, b, ca, cb);
  return dg(a, b, ca, cb);
}

// ---- einsum ----
namespace {

constexpr int kEllipsisBase = 1000;  // labels of ellipsis dims: kEllipsisBase + j

struct Term {
  std::vector<int> labels;  // letters as char codes; -1 marks the ellipsis
  bool has_ellipsis = false;
};

Term parse_term(const std::string& subscripts, const std::string& t) {
  Term term;
  for (size_t i = 0; i < t.size(); ++i) {
    char c = t[i];
    if (c == '.') {
      if (t.compare(i, 3, "...") != 0 || term.has_ellipsis)
        throw ValueError(
            fmt::format("einsum: invalid subscripts \"{}\": '.' may only appear as one '...' per operand", subscripts));
      term.has_ellipsis = true;
      term.labels.push_back(-1);
      i += 2;
    } else if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
      term.labels.push_back(int(c));
    } else {
      throw ValueError(
          fmt::format("einsum: invalid character '{}' in subscripts \"{}\" (use letters, ',', '->' and "
                      "'...')",
                      c, subscripts));
    }
  }
  return term;
}

std::string label_name(int l) {
  if (l >= kEllipsisBase) return fmt::format("... (dimension {})", l - kEllipsisBase);
  return fmt::format("'{}'", char(l));
}

}  // namespace

Array einsum(const std::string& subscripts_in, const std::vector<Array>& operands_in) {
  std::string subs;
  for (char c : subscripts_in)
    if (c != ' ') subs += c;
  if (operands_in.empty()) throw ValueError("einsum: at least one operand is required");
  size_t arrow = subs.find("->");
  std::string lhs = arrow == std::string::npos ? subs : subs.substr(0, arrow);
  std::vector<std::string> term_strs;
  {
    size_t start = 0;
    while (true) {
      size_t comma = lhs.find(',', start);
      term_strs.push_back(lhs.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  }
  if (term_strs.size() != operands_in.size())
    throw ValueError(fmt::format("einsum: subscripts \"{}\" name {} operand(s) but {} were given", subscripts_in,
                                 term_strs.size(), operands_in.size()));
  std::vector<Array> ops = operands_in.size() == 1 ? operands_in : promote_dtypes("einsum", operands_in);
  const size_t nops = ops.size();

  // Expand ellipses into labels aligned from the right (numpy broadcasting).
  std::vector<std::vector<int>> labels(nops);
  std::vector<Term> terms;
  int max_ell = 0;
  for (size_t i = 0; i < nops; ++i) {
    terms.push_back(parse_term(subscripts_in, term_strs[i]));
    int nletters = int(terms[i].labels.size()) - (terms[i].has_ellipsis ? 1 : 0);
    int nd = ops[i].ndim();
    if (terms[i].has_ellipsis ? nd < nletters : nd != nletters)
      throw ShapeError(
          fmt::format("einsum: operand {} has shape {} (rank {}) but its subscripts \"{}\" name {} "
                      "dimension(s)",
                      i, shape_str(ops[i].shape()), nd, term_strs[i], nletters));
    if (terms[i].has_ellipsis) max_ell = std::max(max_ell, nd - nletters);
  }
  for (size_t i = 0; i < nops; ++i) {
    int nell = ops[i].ndim() - (int(terms[i].labels.size()) - (terms[i].has_ellipsis ? 1 : 0));
    for (int l : terms[i].labels) {
      if (l != -1) {
        labels[i].push_back(l);
        continue;
      }
      for (int j = 0; j < nell; ++j) labels[i].push_back(kEllipsisBase + (max_ell - nell) + j);
    }
  }

  // Output labels.
  std::vector<int> out_labels;
  bool any_ellipsis = std::any_of(terms.begin(), terms.end(), [](const Term& t) { return t.has_ellipsis; });
  if (arrow != std::string::npos) {
    Term ot = parse_term(subscripts_in, subs.substr(arrow + 2));
    for (int l : ot.labels) {
      if (l == -1) {
        for (int j = 0; j < max_ell; ++j) out_labels.push_back(kEllipsisBase + j);
        continue;
      }
      if (std::count(out_labels.begin(), out_labels.end(), l))
        throw ValueError(
            fmt::format("einsum: output subscript '{}' appears more than once in \"{}\"", char(l), subscripts_in));
      bool found = false;
      for (auto& ls : labels) found |= std::count(ls.begin(), ls.end(), l) > 0;
      if (!found)
        throw ValueError(fmt::format("einsum: output subscript '{}' in \"{}\" does not appear in any input", char(l),
                                     subscripts_in));
      out_labels.push_back(l);
    }
  } else {
    if (any_ellipsis)
      for (int j = 0; j < max_ell; ++j) out_labels.push_back(kEllipsisBase + j);
    std::map<int, int> count;
    for (auto& ls : labels)
      for (int l : ls)
        if (l < kEllipsisBase) count[l]++;
    for (auto& [l, c] : count)
      if (c == 1) out_labels.push_back(l);
  }

  // Label sizes (size-1 dims broadcast, as opt_einsum allows).
  std::map<int, int64_t> size;
  for (size_t i = 0; i < nops; ++i)
    for (size_t d = 0; d < labels[i].size(); ++d) {
      int l = labels[i][d];
      int64_t s = ops[i].shape()[d];
      auto it = size.find(l);
      if (it == size.end()) {
        size[l] = s;
      } else if (it->second != s) {
        if (it->second != 1 && s != 1)
          throw ShapeError(
              fmt::format("einsum: size of label {} for operand {} ({}) does not match previous terms "
                          "({}) in \"{}\"",
                          label_name(l), i, s, it->second, subscripts_in));
        it->second = std::max(it->second, s);
      }
    }

  // Per operand: drop broadcast size-1 dims, take diagonals of repeated labels.
  for (size_t i = 0; i < nops; ++i) {
    Array x = ops[i];
    auto& ls = labels[i];
    Shape keep_shape;
    std::vector<int> keep;
    for (size_t d = 0; d < ls.size(); ++d) {
      if (x.shape()[d] == 1 && size[ls[d]] != 1) continue;
      keep.push_back(ls[d]);
      keep_shape.push_back(x.shape()[d]);
    }
    if (keep.size() != ls.size()) x = lax::reshape(x, keep_shape);
    ls = keep;
    while (true) {
      size_t p1 = 0, p2 = 0;
      bool rep = false;
      for (size_t a = 0; a < ls.size() && !rep; ++a)
        for (size_t b = a + 1; b < ls.size(); ++b)
          if (ls[a] == ls[b]) {
            p1 = a, p2 = b, rep = true;
            break;
          }
      if (!rep) break;
      int64_t n = x.shape()[p1];
      if (x.shape()[p2] != n)
        throw ShapeError(fmt::format("einsum: label '{}' is repeated in operand {} with different sizes {} and {}",
                                     char(ls[p1]), i, n, x.shape()[p2]));
      // diag(x) over (p1, p2): keep the elements where the two indices agree, then sum out p2.
      std::vector<uint8_t> eye(size_t(n * n), 0);
      for (int64_t k = 0; k < n; ++k) eye[size_t(k * n + k)] = 1;
      Array mask = make_from_host(eye.data(), AbstractValue{{n, n}, DType::bool_, false, {}}, host_device());
      mask = lax::broadcast_in_dim(mask, x.shape(), {int64_t(p1), int64_t(p2)});
      Array zero = lax::broadcast_in_dim(make_scalar(0.0, x.dtype()), x.shape(), {});
      x = lax::select_n(mask, {zero, x});
      x = sum_axes(x, {int64_t(p2)});
      ls.erase(ls.begin() + std::ptrdiff_t(p2));
    }
    ops[i] = x;
  }

  auto in_output = [&](int l) { return std::count(out_labels.begin(), out_labels.end(), l) > 0; };
  auto in_ops = [&](int l, size_t from, size_t skip) {
    for (size_t j = from; j < nops; ++j)
      if (j != skip && std::count(labels[j].begin(), labels[j].end(), l)) return true;
    return false;
  };
  // Sum labels used by one operand only and not in the output.
  for (size_t i = 0; i < nops; ++i) {
    std::vector<int64_t> axes;
    std::vector<int> rest;
    for (size_t d = 0; d < labels[i].size(); ++d) {
      int l = labels[i][d];
      if (!in_output(l) && !in_ops(l, 0, i))
        axes.push_back(int64_t(d));
      else
        rest.push_back(l);
    }
    if (!axes.empty()) {
      ops[i] = sum_axes(ops[i], axes);
      labels[i] = rest;
    }
  }

  // Contract left to right.
  Array cur = ops[0];
  std::vector<int> cl = labels[0];
  for (size_t i = 1; i < nops; ++i) {
    const std::vector<int>& nl = labels[i];
    std::vector<int64_t> ca, cb, ba, bb;
    std::vector<int> batch_l, cfree, nfree;
    for (size_t d = 0; d < cl.size(); ++d) {
      int l = cl[d];
      auto it = std::find(nl.begin(), nl.end(), l);
      if (it == nl.end()) {
        cfree.push_back(l);
        continue;
      }
      int64_t dn = int64_t(it - nl.begin());
      if (in_output(l) || in_ops(l, i + 1, nops)) {
        ba.push_back(int64_t(d));
        bb.push_back(dn);
        batch_l.push_back(l);
      } else {
        ca.push_back(int64_t(d));
        cb.push_back(dn);
      }
    }
    for (int l : nl)
      if (std::find(cl.begin(), cl.end(), l) == cl.end()) nfree.push_back(l);
    cur = dg(cur, ops[i], ca, cb, ba, bb);
    cl = batch_l;
    cl.insert(cl.end(), cfree.begin(), cfree.end());
    cl.insert(cl.end(), nfree.begin(), nfree.end());
  }

  // Anything left that is not in the output (possible with one operand) is summed; then transpose.
  {
    std::vector<int64_t> axes;
    std::vector<int> rest;
    for (size_t d = 0; d < cl.size(); ++d) {
      if (!in_output(cl[d]))
        axes.push_back(int64_t(d));
      else
        rest.push_back(cl[d]);
    }
    if (!axes.empty()) {
      cur = sum_axes(cur, axes);
      cl = rest;
    }
  }
  std::vector<int64_t> perm;
  for (int l : out_labels) {
    auto it = std::find(cl.begin(), cl.end(), l);
    if (it == cl.end()) {
      // An output label all of whose dims were broadcast size-1 dims: restore it with size 1.
      cur = lax::expand_dims(cur, {cur.ndim()});
      cl.push_back(l);
      it = cl.end() - 1;
    }
    perm.push_back(int64_t(it - cl.begin()));
  }
  if (!is_identity(perm)) cur = lax::transpose(cur, perm);
  return cur;
}

}  // namespace cjax::numpy
