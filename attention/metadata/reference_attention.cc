#include "attention/metadata/reference_attention.h"

#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "attention/metadata/validator.h"

namespace attnmeta {
namespace {

absl::Status CheckDims(const AttentionDims& d) {
  if (d.num_q_heads < 1 || d.num_kv_heads < 1 || d.head_dim < 1 ||
      d.num_q_heads % d.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "attention dims: need positive heads and head_dim with num_kv_heads dividing "
        "num_q_heads, got ", d.num_q_heads, "/", d.num_kv_heads, "/", d.head_dim));
  }
  return absl::OkStatus();
}

// Rows [first_row, first_row + n_rows) of a sequence with q_len query rows and kv_len KV
// tokens, over KV positions [kv_begin, kv_end), each row attending to the positions
// visible(row, t) admits (row counted within the sequence). kv_at(t) returns the offset of
// position t's row in the K and V arrays. Writes normalized output and, if lse is not null,
// the log-sum-exp (-inf, and output 0, for a row that sees no position of the range).
template <typename KvAt, typename Visible>
void AttendRange(const AttentionDims& d, const float* q, int64_t first_row, int64_t n_rows,
                 int64_t kv_begin, int64_t kv_end, const float* k, const float* v, KvAt kv_at,
                 Visible visible, float* out, float* lse) {
  const int64_t hd = d.head_dim;
  const int64_t group = d.num_q_heads / d.num_kv_heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  std::vector<int64_t> seen;
  std::vector<double> scores;
  std::vector<double> acc(hd);
  for (int64_t r = 0; r < n_rows; ++r) {
    seen.clear();
    for (int64_t t = kv_begin; t < kv_end; ++t) {
      if (visible(first_row + r, t)) seen.push_back(t);
    }
    for (int64_t h = 0; h < d.num_q_heads; ++h) {
      const float* qv = q + (r * d.num_q_heads + h) * hd;
      const int64_t kvh = h / group;
      float* o = out + (r * d.num_q_heads + h) * hd;
      if (seen.empty()) {
        std::fill(o, o + hd, 0.0f);
        if (lse != nullptr) lse[r * d.num_q_heads + h] = -std::numeric_limits<float>::infinity();
        continue;
      }
      scores.assign(seen.size(), 0.0);
      double m = -std::numeric_limits<double>::infinity();
      for (size_t j = 0; j < seen.size(); ++j) {
        const float* kr = k + kv_at(seen[j]) + kvh * hd;
        double s = 0;
        for (int64_t x = 0; x < hd; ++x) s += static_cast<double>(qv[x]) * kr[x];
        s *= scale;
        scores[j] = s;
        m = std::max(m, s);
      }
      std::fill(acc.begin(), acc.end(), 0.0);
      double sum = 0;
      for (size_t j = 0; j < seen.size(); ++j) {
        const double p = std::exp(scores[j] - m);
        sum += p;
        const float* vr = v + kv_at(seen[j]) + kvh * hd;
        for (int64_t x = 0; x < hd; ++x) acc[x] += p * vr[x];
      }
      for (int64_t x = 0; x < hd; ++x) o[x] = static_cast<float>(acc[x] / sum);
      if (lse != nullptr) lse[r * d.num_q_heads + h] = static_cast<float>(m + std::log(sum));
    }
  }
}

// What row r of sequence i sees: its custom mask, or causal with prefix without one.
// REQUIRES: the metadata validated.
auto SequenceVisibility(const ForwardMetadataView& m, int64_t i) {
  const int64_t q_len = (m.qo_indptr[i + 1] - m.qo_indptr[i]).value();
  const int64_t kv_len = m.kv_lens[i].value();
  const int32_t word_bytes = MaskWordBytes(m.max_q_len);
  return [&m, i, q_len, kv_len, word_bytes](int64_t r, int64_t t) {
    return MaskSees(m.custom_mask, i, q_len, kv_len, word_bytes, r, t);
  };
}

// Checks shapes and validates the metadata against the pool the K/V arrays describe.
absl::Status CheckInputs(const ReferenceAttentionInputs& in, absl::Span<float> out) {
  if (absl::Status s = CheckDims(in.dims); !s.ok()) return s;
  const int64_t kv_row = int64_t{in.dims.num_kv_heads} * in.dims.head_dim;
  const int64_t q_row = int64_t{in.dims.num_q_heads} * in.dims.head_dim;
  if (in.k_pool.size() != in.v_pool.size() || in.k_pool.size() % kv_row != 0) {
    return absl::InvalidArgumentError(absl::StrCat("K/V pools of ", in.k_pool.size(), " and ",
                                                   in.v_pool.size(), " floats are not [slots][",
                                                   in.dims.num_kv_heads, "][", in.dims.head_dim,
                                                   "]"));
  }
  if (in.q.size() % q_row != 0 || out.size() != in.q.size()) {
    return absl::InvalidArgumentError(absl::StrCat("q has ", in.q.size(), " floats, out ",
                                                   out.size(), ", rows of ", q_row));
  }
  ValidationContext ctx{TokenCount(static_cast<int64_t>(in.k_pool.size()) / kv_row),
                        in.page_size, TokenCount(static_cast<int64_t>(in.q.size()) / q_row)};
  ctx.check_slot_ownership = true;
  ctx.allow_padding_page = in.allow_padding_page;
  return ValidateForwardMetadata(in.metadata, ctx);
}

// Attends every sequence through kv_at(i, t), the K/V row offset of token t of sequence i.
template <typename KvAt>
void AttendAll(const ReferenceAttentionInputs& in, const float* k, const float* v, KvAt kv_at,
               absl::Span<float> out, absl::Span<float> lse) {
  const ForwardMetadataView& m = in.metadata;
  const int64_t q_row = int64_t{in.dims.num_q_heads} * in.dims.head_dim;
  for (int64_t i = 0; i < m.batch_size(); ++i) {
    const int64_t q0 = m.qo_indptr[i].value();
    const int64_t q_len = (m.qo_indptr[i + 1] - m.qo_indptr[i]).value();
    const int64_t kv_len = m.kv_lens[i].value();
    AttendRange(
        in.dims, in.q.data() + q0 * q_row, 0, q_len, 0, kv_len, k, v,
        [&](int64_t t) { return kv_at(i, t); }, SequenceVisibility(m, i), out.data() + q0 * q_row,
        lse.empty() ? nullptr : lse.data() + q0 * in.dims.num_q_heads);
  }
}

// lse: empty, or one value per query row and head.
absl::Status CheckLse(absl::Span<const float> lse, int64_t q_values, const AttentionDims& dims) {
  const int64_t want = q_values / dims.head_dim;
  if (!lse.empty() && static_cast<int64_t>(lse.size()) != want) {
    return absl::InvalidArgumentError(
        absl::StrCat("lse of ", lse.size(), " values, want ", want, " (query rows x heads)"));
  }
  return absl::OkStatus();
}

// Checks `gather` against the metadata and copies its K/V rows into linear buffers.
absl::Status Linearize(const ReferenceAttentionInputs& in, const ContextGather& gather,
                       std::vector<float>& k_lin, std::vector<float>& v_lin) {
  const ForwardMetadataView& m = in.metadata;
  const int64_t bs = m.batch_size();
  if (static_cast<int64_t>(gather.cu_k.size()) != bs + 1 || gather.cu_k[0].value() != 0 ||
      gather.cu_k.back().value() != static_cast<int64_t>(gather.tok_idx.size())) {
    return absl::InvalidArgumentError(
        "gather: cu_k must be [bs + 1], start at 0 and end at tok_idx's size");
  }
  for (int64_t i = 0; i < bs; ++i) {
    if (gather.cu_k[i + 1] - gather.cu_k[i] != m.kv_lens[i].count()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "gather: sequence ", i, " has ", (gather.cu_k[i + 1] - gather.cu_k[i]).value(),
          " tokens, kv_len ", m.kv_lens[i].value()));
    }
  }
  const int64_t kv_row = int64_t{in.dims.num_kv_heads} * in.dims.head_dim;
  const int64_t pool_slots = static_cast<int64_t>(in.k_pool.size()) / kv_row;
  k_lin.assign(gather.tok_idx.size() * kv_row, 0.0f);
  v_lin.assign(gather.tok_idx.size() * kv_row, 0.0f);
  for (size_t r = 0; r < gather.tok_idx.size(); ++r) {
    const int64_t s = gather.tok_idx[r].value();
    if (s < 0 || s >= pool_slots) {
      return absl::InvalidArgumentError(absl::StrCat("gather: tok_idx[", r, "] = slot ", s,
                                                     " outside the pool of ", pool_slots));
    }
    std::copy_n(in.k_pool.data() + s * kv_row, kv_row, k_lin.data() + r * kv_row);
    std::copy_n(in.v_pool.data() + s * kv_row, kv_row, v_lin.data() + r * kv_row);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ReferenceAttentionTokenLevel(const ReferenceAttentionInputs& in, absl::Span<float> out,
                                          absl::Span<float> lse) {
  if (absl::Status s = CheckInputs(in, out); !s.ok()) return s;
  if (absl::Status s = CheckLse(lse, static_cast<int64_t>(in.q.size()), in.dims); !s.ok()) return s;
  const int64_t kv_row = int64_t{in.dims.num_kv_heads} * in.dims.head_dim;
  const ForwardMetadataView& m = in.metadata;
  AttendAll(
      in, in.k_pool.data(), in.v_pool.data(),
      [&](int64_t i, int64_t t) {
        return m.kv_indices[m.kv_indptr[i].value() + t].value() * kv_row;
      },
      out, lse);
  return absl::OkStatus();
}

absl::Status ReferenceAttentionPageTable(const ReferenceAttentionInputs& in, absl::Span<float> out,
                                         absl::Span<float> lse) {
  if (absl::Status s = CheckInputs(in, out); !s.ok()) return s;
  if (absl::Status s = CheckLse(lse, static_cast<int64_t>(in.q.size()), in.dims); !s.ok()) return s;
  const ForwardMetadataView& m = in.metadata;
  if (m.page_table.rows() < m.batch_size()) {
    return absl::InvalidArgumentError("page-table attention needs a page table");
  }
  const int64_t kv_row = int64_t{in.dims.num_kv_heads} * in.dims.head_dim;
  const PageSize ps = in.page_size;
  AttendAll(
      in, in.k_pool.data(), in.v_pool.data(),
      [&](int64_t i, int64_t t) {
        const PageId page = m.page_table.row(i)[t / ps.tokens()];
        return (FirstSlotOf(page, ps) + TokenCount(t % ps.tokens())).value() * kv_row;
      },
      out, lse);
  return absl::OkStatus();
}

absl::Status ReferenceAttentionGathered(const ReferenceAttentionInputs& in,
                                        const ContextGather& gather, absl::Span<float> out) {
  if (absl::Status s = CheckInputs(in, out); !s.ok()) return s;
  std::vector<float> k_lin, v_lin;
  if (absl::Status s = Linearize(in, gather, k_lin, v_lin); !s.ok()) return s;
  const int64_t kv_row = int64_t{in.dims.num_kv_heads} * in.dims.head_dim;
  AttendAll(in, k_lin.data(), v_lin.data(),
            [&](int64_t i, int64_t t) { return (gather.cu_k[i].value() + t) * kv_row; }, out, {});
  return absl::OkStatus();
}

namespace {

// Runs `plan` reading K/V row kv_at(i, t) of k and v for token t of sequence i.
// REQUIRES: CheckInputs(in, out) passed.
template <typename KvAt>
absl::Status RunSplitPlan(const ReferenceAttentionInputs& in, const SplitKvPlan& plan,
                          const float* k, const float* v, KvAt kv_at, absl::Span<float> out) {
  const ForwardMetadataView& m = in.metadata;
  const int64_t q_row = int64_t{in.dims.num_q_heads} * in.dims.head_dim;
  const int64_t heads = in.dims.num_q_heads;
  // The whole plan is checked before anything is allocated by its counts or written to out.
  if (plan.num_partials < 0 || plan.num_partials > static_cast<int64_t>(plan.work.size())) {
    return absl::InvalidArgumentError(absl::StrCat("plan: ", plan.num_partials,
                                                   " partial slots for ", plan.work.size(),
                                                   " work items"));
  }
  std::vector<int64_t> partial_rows(plan.num_partials, -1);  // rows of each slot's item
  for (const SplitKvWorkItem& w : plan.work) {
    if (w.sequence < 0 || w.sequence >= m.batch_size()) {
      return absl::InvalidArgumentError(absl::StrCat("plan: sequence ", w.sequence, " outside the batch"));
    }
    const int64_t i = w.sequence;
    const int64_t q0 = m.qo_indptr[i].value();
    const int64_t q_len = (m.qo_indptr[i + 1] - m.qo_indptr[i]).value();
    const int64_t kv_len = m.kv_lens[i].value();
    if (w.q_begin.value() < q0 || w.q_end.value() > q0 + q_len || w.q_end < w.q_begin ||
        w.kv_begin.value() < 0 || w.kv_end.value() > kv_len || w.kv_end < w.kv_begin ||
        w.partial_slot >= plan.num_partials) {
      return absl::InvalidArgumentError(absl::StrCat("plan: work item of sequence ", i,
                                                     " outside the sequence's rows or KV"));
    }
    if (w.partial_slot >= 0) partial_rows[w.partial_slot] = (w.q_end - w.q_begin).value();
  }
  for (const SplitKvReduceItem& red : plan.reduce) {
    const int64_t rows = (red.q_end - red.q_begin).value();
    if (red.sequence < 0 || red.sequence >= m.batch_size() ||
        red.q_begin < m.qo_indptr[red.sequence] || red.q_end > m.qo_indptr[red.sequence + 1] ||
        rows < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "plan: reduce item of sequence ", red.sequence, " outside the sequence's rows"));
    }
    if (red.partial_begin < 0 || red.partial_end > plan.num_partials ||
        red.partial_begin >= red.partial_end) {
      return absl::InvalidArgumentError("plan: reduce item outside the partial slots");
    }
    for (int32_t p = red.partial_begin; p < red.partial_end; ++p) {
      if (partial_rows[p] != rows) {
        return absl::InvalidArgumentError(absl::StrCat("plan: partial slot ", p,
                                                       " does not match its reduce item"));
      }
    }
  }
  std::vector<std::vector<float>> partial_out(plan.num_partials);
  std::vector<std::vector<float>> partial_lse(plan.num_partials);
  for (const SplitKvWorkItem& w : plan.work) {
    const int64_t i = w.sequence;
    const int64_t q0 = m.qo_indptr[i].value();
    const int64_t rows = (w.q_end - w.q_begin).value();
    float* dst;
    float* lse = nullptr;
    if (w.partial_slot < 0) {
      dst = out.data() + w.q_begin.value() * q_row;
    } else {
      partial_out[w.partial_slot].assign(rows * q_row, 0.0f);
      partial_lse[w.partial_slot].assign(rows * heads, 0.0f);
      dst = partial_out[w.partial_slot].data();
      lse = partial_lse[w.partial_slot].data();
    }
    AttendRange(in.dims, in.q.data() + w.q_begin.value() * q_row, w.q_begin.value() - q0, rows,
                w.kv_begin.value(), w.kv_end.value(), k, v,
                [&](int64_t t) { return kv_at(i, t); }, SequenceVisibility(m, i), dst, lse);
  }
  for (const SplitKvReduceItem& red : plan.reduce) {
    const int64_t rows = (red.q_end - red.q_begin).value();
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t e = r * heads + h;
        double mx = -std::numeric_limits<double>::infinity();
        for (int32_t p = red.partial_begin; p < red.partial_end; ++p) {
          mx = std::max<double>(mx, partial_lse[p][e]);
        }
        float* o = out.data() + (red.q_begin.value() + r) * q_row + h * in.dims.head_dim;
        for (int64_t x = 0; x < in.dims.head_dim; ++x) {
          double num = 0, den = 0;
          for (int32_t p = red.partial_begin; p < red.partial_end; ++p) {
            if (std::isinf(partial_lse[p][e])) continue;
            const double w = std::exp(partial_lse[p][e] - mx);
            num += w * partial_out[p][e * in.dims.head_dim + x];
            den += w;
          }
          o[x] = static_cast<float>(num / den);
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ReferenceAttentionSplitKv(const ReferenceAttentionInputs& in, const SplitKvPlan& plan,
                                       absl::Span<float> out) {
  if (absl::Status s = CheckInputs(in, out); !s.ok()) return s;
  const ForwardMetadataView& m = in.metadata;
  const int64_t kv_row = int64_t{in.dims.num_kv_heads} * in.dims.head_dim;
  return RunSplitPlan(
      in, plan, in.k_pool.data(), in.v_pool.data(),
      [&](int64_t i, int64_t t) { return m.kv_indices[m.kv_indptr[i].value() + t].value() * kv_row; },
      out);
}

absl::Status ReferenceAttentionGatheredSplitKv(const ReferenceAttentionInputs& in,
                                               const ContextGather& gather,
                                               const SplitKvPlan& plan, absl::Span<float> out) {
  if (plan.layout.paged() || plan.layout.block().tokens() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "split-KV plan: made for a paged layout of block ", plan.layout.block().tokens(),
        " tokens, but this consumer reads linear per-token K/V (plan it with "
        "KvLayout::LinearPerToken())"));
  }
  if (absl::Status s = CheckInputs(in, out); !s.ok()) return s;
  std::vector<float> k_lin, v_lin;
  if (absl::Status s = Linearize(in, gather, k_lin, v_lin); !s.ok()) return s;
  const int64_t kv_row = int64_t{in.dims.num_kv_heads} * in.dims.head_dim;
  return RunSplitPlan(
      in, plan, k_lin.data(), v_lin.data(),
      [&](int64_t i, int64_t t) { return (gather.cu_k[i].value() + t) * kv_row; }, out);
}

namespace {

absl::Status CheckDenseShapes(const AttentionDims& dims, absl::Span<const float> q,
                              absl::Span<const float> k, absl::Span<const float> v,
                              absl::Span<float> out, int64_t* q_len, int64_t* kv_len) {
  if (absl::Status s = CheckDims(dims); !s.ok()) return s;
  const int64_t q_row = int64_t{dims.num_q_heads} * dims.head_dim;
  const int64_t kv_row = int64_t{dims.num_kv_heads} * dims.head_dim;
  if (q.size() % q_row != 0 || out.size() != q.size() || k.size() != v.size() ||
      k.size() % kv_row != 0) {
    return absl::InvalidArgumentError("dense attention: shapes disagree");
  }
  *q_len = static_cast<int64_t>(q.size()) / q_row;
  *kv_len = static_cast<int64_t>(k.size()) / kv_row;
  if (*q_len > *kv_len) return absl::InvalidArgumentError("dense attention: q_len > kv_len");
  return absl::OkStatus();
}

}  // namespace

absl::Status DenseAttention(const AttentionDims& dims, absl::Span<const float> q,
                            absl::Span<const float> k, absl::Span<const float> v,
                            absl::Span<float> out, absl::Span<float> lse) {
  int64_t q_len = 0, kv_len = 0;
  if (absl::Status s = CheckDenseShapes(dims, q, k, v, out, &q_len, &kv_len); !s.ok()) return s;
  if (absl::Status s = CheckLse(lse, static_cast<int64_t>(q.size()), dims); !s.ok()) return s;
  const int64_t kv_row = int64_t{dims.num_kv_heads} * dims.head_dim;
  AttendRange(
      dims, q.data(), 0, q_len, 0, kv_len, k.data(), v.data(),
      [&](int64_t t) { return t * kv_row; },
      [&](int64_t r, int64_t t) { return t <= kv_len - q_len + r; }, out.data(),
      lse.empty() ? nullptr : lse.data());
  return absl::OkStatus();
}

absl::Status DenseMaskedAttention(const AttentionDims& dims, absl::Span<const float> q,
                                  absl::Span<const float> k, absl::Span<const float> v,
                                  absl::Span<const uint8_t> sees, absl::Span<float> out,
                                  absl::Span<float> lse) {
  int64_t q_len = 0, kv_len = 0;
  if (absl::Status s = CheckDenseShapes(dims, q, k, v, out, &q_len, &kv_len); !s.ok()) return s;
  if (absl::Status s = CheckLse(lse, static_cast<int64_t>(q.size()), dims); !s.ok()) return s;
  if (static_cast<int64_t>(sees.size()) != q_len * kv_len) {
    return absl::InvalidArgumentError(absl::StrCat("dense masked attention: mask of ", sees.size(),
                                                   " bytes, want ", q_len, " x ", kv_len));
  }
  const int64_t kv_row = int64_t{dims.num_kv_heads} * dims.head_dim;
  AttendRange(
      dims, q.data(), 0, q_len, 0, kv_len, k.data(), v.data(),
      [&](int64_t t) { return t * kv_row; },
      [&](int64_t r, int64_t t) { return sees[r * kv_len + t] != 0; }, out.data(),
      lse.empty() ? nullptr : lse.data());
  return absl::OkStatus();
}

}  // namespace attnmeta
