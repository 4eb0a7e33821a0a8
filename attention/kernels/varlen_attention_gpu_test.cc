// GPU tests of varlen attention (varlen_attention_launcher.h) against the CPU reference
// attention (attention/metadata/reference_attention.h) over metadata built by the real builders:
// extend with a cached prefix (BuildForwardMetadata), a 4-row draft-extend
// (BuildDraftExtendMetadata) and target-verify with the tree mask in the FULL, QLEN_ONLY and
// bit-packed layouts (BuildVerifyTreeFromParents + BuildTargetVerifyMetadata); batches laid out
// by the real allocator with shuffled pages (page sizes 1, 7, 16, 64, unaligned lengths), K/V
// read through token-level kv_indices and through the page table; bf16 and fp16, head dims 64,
// 128, 256, GQA and MHA; the log-sum-exp against a double-precision computation here over the
// positions MaskSees admits; empty sequences and a row that sees nothing; bad inputs refused
// before any launch; corrupted device metadata recorded in the violation word and never read
// out of bounds (run the binary under compute-sanitizer memcheck for the proof). Outputs are
// poisoned with 0xFF bytes, a NaN in bf16, fp16 and fp32, before every run, and checked
// written in full. Random N(0, 1) data from fixed seeds; a failure names the seed and the case.
// Needs a GPU: fails when none is visible.
//
// Error bounds. The inputs are bf16 or fp16 values and the reference reads the same values as
// floats with double accumulation, so what differs is the kernel's fp32 arithmetic (relative
// ~1e-6) and the rounding of the output to the input type: half an ulp is 2^-9 relative for
// bf16 and 2^-12 for fp16, and outputs are weighted means of N(0, 1) values (|out| < 4). Per
// element: bf16 |got - want| <= 1e-2 + 1e-2 |want|, fp16 <= 2e-3 + 2e-3 |want|; the fp32
// log-sum-exp <= 1e-3 + 1e-5 |want| (exactly -inf for a row that sees nothing).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "attention/kernels/checked_metadata.h"
#include "attention/kernels/testing/attention_inputs.h"
#include "attention/kernels/testing/device_buffer.h"
#include "attention/kernels/testing/gpu_test.h"
#include "attention/kernels/testing/overlap.h"
#include "attention/kernels/testing/upload.h"
#include "attention/kernels/varlen_attention_launcher.h"
#include "attention/metadata/builders.h"
#include "attention/metadata/custom_mask.h"
#include "attention/metadata/reference_attention.h"
#include "attention/metadata/testing/batch_fixture.h"
#include "attention/metadata/validator.h"
#include "gtest/gtest.h"
#include "spec_decode/speculative_metadata.h"
#include "spec_decode/verify_tree.h"

namespace attnmeta {
namespace {

using testing::BatchFixture;
using testing::Bytes;
using testing::DeviceBuffer;
using testing::Dims;
using testing::Download;
using testing::FromBits;
using testing::Poison;
using testing::Upload;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;


std::string DimsName(const DecodeAttentionDims& d) {
  return absl::StrCat(d.num_q_heads, "/", d.num_kv_heads, " heads, head_dim ", d.head_dim,
                      d.dtype == KvElementType::kBf16 ? " bf16" : " fp16");
}

// A batch laid out by the allocator (shuffled pages) and the metadata a real builder made for
// it; random N(0, 1) Q, K and V rounded to the element type; the reference output and
// log-sum-exp of every query row.
struct Problem {
  DecodeAttentionDims dims;
  std::unique_ptr<BatchFixture> fixture;
  ForwardMetadata metadata;
  std::vector<uint16_t> q_bits, k_bits, v_bits;
  std::vector<float> q, k, v;   // the same values as floats
  std::vector<float> want_out;  // [rows][num_q_heads][head_dim]
  std::vector<double> want_lse; // [rows][num_q_heads]
  std::string what;             // the case: builder, seed, page size, dims (printed on failure)

  int64_t bs() const { return static_cast<int64_t>(metadata.kv_lens.size()); }
  int64_t rows() const { return metadata.qo_indptr.back().value(); }
  int64_t kv_row() const { return int64_t{dims.num_kv_heads} * dims.head_dim; }
  int64_t q_row() const { return int64_t{dims.num_q_heads} * dims.head_dim; }
};

// log(sum exp(scale * q.k)) of query head h of row r of sequence i over the positions MaskSees
// admits, in double; -inf when it sees none.
double Lse(const Problem& p, int64_t i, int64_t r, int32_t h) {
  const ForwardMetadataView m = p.metadata.view();
  const int64_t q0 = m.qo_indptr[i].value();
  const int64_t q_len = (m.qo_indptr[i + 1] - m.qo_indptr[i]).value();
  const int64_t kv_len = m.kv_lens[i].value();
  const int32_t word_bytes = MaskWordBytes(m.max_q_len);
  const int32_t kv_head = h / (p.dims.num_q_heads / p.dims.num_kv_heads);
  const float* q = p.q.data() + (q0 + r) * p.q_row() + int64_t{h} * p.dims.head_dim;
  std::vector<double> s;
  for (int64_t c = 0; c < kv_len; ++c) {
    if (!MaskSees(m.custom_mask, i, q_len, kv_len, word_bytes, r, c)) continue;
    const int64_t slot = m.kv_indices[m.kv_indptr[i].value() + c].value();
    const float* k = p.k.data() + slot * p.kv_row() + int64_t{kv_head} * p.dims.head_dim;
    double dot = 0;
    for (int32_t x = 0; x < p.dims.head_dim; ++x) dot += double{q[x]} * k[x];
    s.push_back(dot * p.dims.softmax_scale);
  }
  if (s.empty()) return -std::numeric_limits<double>::infinity();
  const double mx = *std::max_element(s.begin(), s.end());
  double sum = 0;
  for (double x : s) sum += std::exp(x - mx);
  return mx + std::log(sum);
}

// Random data for the problem's fixture and metadata, and the reference results.
void FillProblem(Problem& p, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t pool_slots = p.fixture->pool_slots().value();
  testing::FillNormal(p.dims.dtype, pool_slots * p.kv_row(), rng, normal, p.k_bits, p.k);
  testing::FillNormal(p.dims.dtype, pool_slots * p.kv_row(), rng, normal, p.v_bits, p.v);
  testing::FillNormal(p.dims.dtype, p.rows() * p.q_row(), rng, normal, p.q_bits, p.q);

  // The reference scores with 1 / sqrt(head_dim): another scale is folded into its queries.
  const float fold = p.dims.softmax_scale * std::sqrt(static_cast<float>(p.dims.head_dim));
  std::vector<float> ref_q(p.q);
  for (float& x : ref_q) x *= fold;
  const ReferenceAttentionInputs in{
      AttentionDims{p.dims.num_q_heads, p.dims.num_kv_heads, p.dims.head_dim}, p.metadata.view(),
      p.fixture->page_size(), ref_q, p.k, p.v};
  p.want_out.assign(p.q.size(), 0.0f);
  const absl::Status s = ReferenceAttentionTokenLevel(in, absl::MakeSpan(p.want_out));
  EXPECT_TRUE(s.ok()) << s;
  for (int64_t i = 0; i < p.bs(); ++i) {
    const int64_t q_len = (p.metadata.qo_indptr[i + 1] - p.metadata.qo_indptr[i]).value();
    for (int64_t r = 0; r < q_len; ++r) {
      for (int32_t h = 0; h < p.dims.num_q_heads; ++h) p.want_lse.push_back(Lse(p, i, r, h));
    }
  }
}

// A problem of `dims` named `what`, on a fixture at page size `ps` that holds sequence j with
// cached[j] tokens from earlier steps and new_tokens[j] more; its metadata, data and reference
// are the caller's to make.
Problem NewProblem(const DecodeAttentionDims& dims, int64_t ps, const std::vector<int64_t>& cached,
                   const std::vector<int64_t>& new_tokens, uint64_t seed, std::string what) {
  Problem p;
  p.dims = dims;
  p.what = std::move(what);
  int64_t pages = 8, longest = 1;
  for (size_t j = 0; j < cached.size(); ++j) {
    const int64_t len = cached[j] + new_tokens[j];
    pages += len / ps + 2;
    longest = std::max(longest, len);
  }
  p.fixture = std::make_unique<BatchFixture>(ps, seed, pages, static_cast<int32_t>(cached.size()) + 2,
                                             longest + 16);
  for (size_t j = 0; j < cached.size(); ++j) p.fixture->AddSequence(cached[j], new_tokens[j]);
  return p;
}

// The problem's metadata, built as extend without a mask (BuildForwardMetadata).
void BuildExtendMetadata(Problem& p) {
  auto m = BuildForwardMetadata(p.fixture->Batch(ForwardMode::kExtend), p.fixture->pool(),
                                p.fixture->page_size(),
                                BuildOptions{true, MaskLayout::kNone,
                                             MetadataCheck{p.fixture->pool_slots(),
                                                           p.fixture->num_query_rows()}});
  EXPECT_TRUE(m.ok()) << m.status();
  p.metadata = *std::move(m);
}

// Extend (prefill with a cached prefix): sequence j has cached[j] tokens from earlier steps and
// new_tokens[j] query rows (BuildForwardMetadata, mode extend).
Problem MakeExtend(const DecodeAttentionDims& dims, int64_t ps, const std::vector<int64_t>& cached,
                   const std::vector<int64_t>& new_tokens, uint64_t seed) {
  Problem p = NewProblem(dims, ps, cached, new_tokens, seed,
                         absl::StrCat("extend, seed ", seed, ", page_size ", ps, ", ", DimsName(dims)));
  BuildExtendMetadata(p);
  FillProblem(p, seed);
  return p;
}

// Draft-extend, fixed form: every request extends by `n` rows on top of cached[j] tokens.
Problem MakeDraftExtend(const DecodeAttentionDims& dims, int64_t ps, const std::vector<int64_t>& cached,
                        int32_t n, uint64_t seed) {
  Problem p = NewProblem(
      dims, ps, cached, std::vector<int64_t>(cached.size(), n), seed,
      absl::StrCat("draft-extend ", n, " rows, seed ", seed, ", page_size ", ps, ", ", DimsName(dims)));
  DraftExtendBatch b;
  b.req_rows = p.fixture->rows();
  b.kv_lens = p.fixture->kv_lens();
  b.num_tokens_per_req = TokenCount(n);
  b.num_query_rows = TokenCount(static_cast<int64_t>(cached.size()) * n);
  auto m = BuildDraftExtendMetadata(b, p.fixture->pool(), p.fixture->page_size(),
                                    SpecBuildOptions{true, p.fixture->pool_slots()});
  EXPECT_TRUE(m.ok()) << m.status();
  p.metadata = *std::move(m);
  FillProblem(p, seed);
  return p;
}

// Target-verify: request j has seq_lens[j] committed tokens and the n draft tokens of a tree
// (parents: n entries per request, -1 for the root), its mask in `layout`.
Problem MakeVerify(const DecodeAttentionDims& dims, int64_t ps, const std::vector<int64_t>& seq_lens,
                   const std::vector<int32_t>& parents, int32_t n, MaskLayout layout, uint64_t seed) {
  Problem p = NewProblem(dims, ps, seq_lens, std::vector<int64_t>(seq_lens.size(), n), seed,
                         absl::StrCat("target-verify ", n, " draft tokens, mask ", MaskLayoutName(layout),
                                      ", seed ", seed, ", page_size ", ps, ", ", DimsName(dims)));
  std::vector<TokenLength> committed;
  for (int64_t s : seq_lens) committed.push_back(TokenLength(static_cast<int32_t>(s)));
  auto tree = BuildVerifyTreeFromParents(parents, committed, TokenLength(n));
  EXPECT_TRUE(tree.ok()) << tree.status();
  auto m = BuildTargetVerifyMetadata(p.fixture->pool(), p.fixture->rows(), *tree, layout,
                                     TokenCount(static_cast<int64_t>(seq_lens.size()) * n),
                                     p.fixture->page_size(),
                                     SpecBuildOptions{true, p.fixture->pool_slots()});
  EXPECT_TRUE(m.ok()) << m.status();
  p.metadata = *std::move(m);
  FillProblem(p, seed);
  return p;
}

// A tree of n tokens per request: token t >= 1 hangs off token (t - 1) / 2 (a binary tree), so
// that rows see a few but not all of the other draft tokens.
std::vector<int32_t> BinaryTrees(int64_t bs, int32_t n) {
  std::vector<int32_t> parents;
  for (int64_t b = 0; b < bs; ++b) {
    for (int32_t t = 0; t < n; ++t) parents.push_back(t == 0 ? -1 : (t - 1) / 2);
  }
  return parents;
}

// Extend with a custom mask in `layout` over ragged q_lens: sequence j has cached[j] tokens
// and new_tokens[j] query rows (BuildForwardMetadata, mode extend), and a random mask built
// by BuildMaskIndptr / BuildCustomMask in which each row sees its own position (so that the
// validator, which the reference runs, accepts it) and about half of the other query rows.
// prefix_holes (FULL only): every third prefix position, staggered by row, is cleared too.
Problem MakeMaskedExtend(const DecodeAttentionDims& dims, int64_t ps, const std::vector<int64_t>& cached,
                         const std::vector<int64_t>& new_tokens, MaskLayout layout, bool prefix_holes,
                         uint64_t seed) {
  Problem p = NewProblem(dims, ps, cached, new_tokens, seed,
                         absl::StrCat("masked extend, mask ", MaskLayoutName(layout),
                                      prefix_holes ? " with prefix holes" : "", ", seed ", seed,
                                      ", page_size ", ps, ", ", DimsName(dims)));
  BuildExtendMetadata(p);
  ForwardMetadata& md = p.metadata;
  std::vector<TokenLength> q_lens;
  for (size_t i = 0; i + 1 < md.qo_indptr.size(); ++i) {
    q_lens.push_back(TokenLength((md.qo_indptr[i + 1] - md.qo_indptr[i]).value()));
  }
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> tree_rows;
  for (const TokenLength q_len : q_lens) {
    for (int32_t r = 0; r < q_len.value(); ++r) {
      for (int32_t c = 0; c < q_len.value(); ++c) tree_rows.push_back(r == c ? 1 : rng() % 2);
    }
  }
  md.mask_layout = layout;
  md.mask_indptr.assign(q_lens.size() + 1, 0);
  absl::Status s = BuildMaskIndptr(layout, q_lens, md.kv_lens, absl::MakeSpan(md.mask_indptr));
  EXPECT_TRUE(s.ok()) << s;
  md.custom_mask.assign(md.mask_indptr.back(), 0);
  s = BuildCustomMask(layout, tree_rows, q_lens, md.kv_lens, md.mask_indptr,
                      absl::MakeSpan(md.custom_mask));
  EXPECT_TRUE(s.ok()) << s;
  if (prefix_holes) {
    EXPECT_EQ(layout, MaskLayout::kFull);
    for (size_t i = 0; i < q_lens.size(); ++i) {
      const int64_t q_len = q_lens[i].value(), kv_len = md.kv_lens[i].value();
      for (int64_t r = 0; r < q_len; ++r) {
        for (int64_t c = r % 3; c < kv_len - q_len; c += 3) md.custom_mask[md.mask_indptr[i] + r * kv_len + c] = 0;
      }
    }
  }
  FillProblem(p, seed);
  return p;
}

// The problem's inputs in device memory.
struct DeviceProblem {
  DeviceBuffer<uint8_t> q, k, v;
  DeviceBuffer<TokenOffset> qo_indptr, kv_indptr;
  DeviceBuffer<TokenSlot> kv_indices;
  DeviceBuffer<PageId> page_table;
  DeviceBuffer<TokenLength> kv_lens;
  DeviceBuffer<uint8_t> mask;
  DeviceBuffer<int64_t> mask_indptr;
  PageCount cols;
  PageSize page_size;
  MaskLayout layout;
  TokenCount max_q_len;

  DecodeKv TokenLevel() const {
    return DecodeTokenLevelKv{kv_indptr.const_span(), kv_indices.const_span()};
  }
  DecodeKv PageLevel() const {
    return DecodePageTableKv{page_table.const_span(), cols, kv_lens.const_span(), page_size};
  }
  VarlenMask Mask() const { return VarlenMask{layout, mask.const_span(), mask_indptr.const_span()}; }
};

DeviceProblem ToDevice(const Problem& p) {
  const ForwardMetadata& m = p.metadata;
  const absl::Span<const PageId> table = m.page_table.span().entries();
  return DeviceProblem{Upload(Bytes(p.q_bits)),
                       Upload(Bytes(p.k_bits)),
                       Upload(Bytes(p.v_bits)),
                       Upload(m.qo_indptr),
                       Upload(m.kv_indptr),
                       Upload(m.kv_indices),
                       Upload(std::vector<PageId>(table.begin(), table.end())),
                       Upload(m.kv_lens),
                       Upload(m.custom_mask),
                       Upload(m.mask_indptr),
                       m.page_table.cols(),
                       p.fixture->page_size(),
                       m.mask_layout,
                       m.max_q_len};
}

// The problem's inputs with a sequence of no query rows inserted before sequence `at` (so its
// qo_indptr and mask_indptr steps are 0): no KV through kv_indptr, and sequence `at`'s KV
// (a prefix without rows) through the page table. The query rows, and so the results, are
// the problem's.
DeviceProblem ToDeviceWithEmptySequence(const Problem& p, int64_t at) {
  const ForwardMetadata& m = p.metadata;
  std::vector<TokenOffset> qo(m.qo_indptr), kv(m.kv_indptr);
  qo.insert(qo.begin() + at, qo[at]);
  kv.insert(kv.begin() + at, kv[at]);
  std::vector<TokenLength> lens(m.kv_lens);
  lens.insert(lens.begin() + at, lens[at]);
  const int64_t cols = m.page_table.cols().value();
  const absl::Span<const PageId> entries = m.page_table.span().entries();
  std::vector<PageId> table(entries.begin(), entries.end());
  table.insert(table.begin() + at * cols, entries.begin() + at * cols, entries.begin() + (at + 1) * cols);
  std::vector<int64_t> mask_indptr(m.mask_indptr);
  if (!mask_indptr.empty()) mask_indptr.insert(mask_indptr.begin() + at, mask_indptr[at]);
  return DeviceProblem{Upload(Bytes(p.q_bits)), Upload(Bytes(p.k_bits)), Upload(Bytes(p.v_bits)),
                       Upload(qo), Upload(kv), Upload(m.kv_indices), Upload(table), Upload(lens),
                       Upload(m.custom_mask), Upload(mask_indptr), PageCount(cols),
                       p.fixture->page_size(),
                       m.mask_layout, m.max_q_len};
}

struct Result {
  absl::Status status;
  std::vector<float> out;  // [rows][num_q_heads][head_dim]
  std::vector<float> lse;  // [rows][num_q_heads]
  std::vector<uint8_t> out_bytes;
};

// The arguments of one call on `d` reading K/V through `kv`, writing `out` and `lse`.
VarlenAttentionArgs Args(const DecodeAttentionDims& dims, const DeviceProblem& d, const DecodeKv& kv,
                         const DeviceBuffer<uint8_t>& out, const DeviceBuffer<float>& lse) {
  VarlenAttentionArgs a;
  a.dims = dims;
  a.q = d.q.const_span();
  a.qo_indptr = d.qo_indptr.const_span();
  a.max_q_len = d.max_q_len;
  a.k_pool = d.k.const_span();
  a.v_pool = d.v.const_span();
  a.kv = kv;
  a.mask = d.Mask();
  a.out = out.span();
  a.lse = lse.span();
  return a;
}

// One call of the launcher on the inputs through `kv`, into outputs poisoned first.
Result RunVarlen(const DecodeAttentionDims& dims, const DeviceProblem& d, const DecodeKv& kv,
                 kernels::DeviceViolation* violation = nullptr,
                 VarlenKernel kernel = VarlenKernel::kAuto, bool zero_unclaimed_rows = false) {
  const int64_t rows = static_cast<int64_t>(d.q.size()) / (int64_t{dims.num_q_heads} * dims.head_dim * 2);
  DeviceBuffer<uint8_t> out = *DeviceBuffer<uint8_t>::Create(d.q.size());
  DeviceBuffer<float> lse = *DeviceBuffer<float>::Create(rows * dims.num_q_heads);
  Poison(out.data(), out.size());
  Poison(lse.data(), lse.size() * sizeof(float));
  Result r;
  VarlenAttentionArgs a = Args(dims, d, kv, out, lse);
  a.kernel = kernel;
  a.zero_unclaimed_rows = zero_unclaimed_rows;
  r.status = VarlenAttention(a, violation, nullptr);
  EXPECT_EQ(hipDeviceSynchronize(), hipSuccess);
  r.out_bytes = Download(out);
  r.lse = Download(lse);
  r.out.resize(out.size() / 2);
  for (size_t e = 0; e < r.out.size(); ++e) {
    uint16_t bits;
    std::memcpy(&bits, r.out_bytes.data() + 2 * e, 2);
    r.out[e] = FromBits(dims.dtype, bits);
  }
  return r;
}

bool Near(double got, double want, double abs, double rel) {
  return std::fabs(got - want) <= abs + rel * std::fabs(want);
}

// Query row `row` of a run against the problem's reference: every element written (no NaN left
// of the poison) and within the dtype's bounds; lse too.
void ExpectRow(const Problem& p, const Result& r, int64_t row) {
  const bool bf16 = p.dims.dtype == KvElementType::kBf16;
  const double abs = bf16 ? 1e-2 : 2e-3, rel = bf16 ? 1e-2 : 2e-3;
  const int64_t heads = p.dims.num_q_heads, dim = p.dims.head_dim;
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t x = 0; x < dim; ++x) {
      const float got = r.out[(row * heads + h) * dim + x];
      const float want = p.want_out[(row * heads + h) * dim + x];
      ASSERT_TRUE(Near(got, want, abs, rel))
          << p.what << ": row " << row << " head " << h << " dim " << x << ": got " << got
          << " want " << want;
    }
    const float got = r.lse[row * heads + h];
    const double want = p.want_lse[row * heads + h];
    if (std::isinf(want)) {
      ASSERT_EQ(got, -kInf) << p.what << ": lse row " << row << " head " << h;
    } else {
      ASSERT_TRUE(Near(got, want, 1e-3, 1e-5))
          << p.what << ": lse row " << row << " head " << h << ": got " << got << " want " << want;
    }
  }
}

// The rows of sequence i.
void ExpectSequence(const Problem& p, const Result& r, int64_t i) {
  for (int64_t row = p.metadata.qo_indptr[i].value(); row < p.metadata.qo_indptr[i + 1].value(); ++row) {
    ExpectRow(p, r, row);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

void ExpectMatches(const Problem& p, const Result& r) {
  ASSERT_TRUE(r.status.ok()) << p.what << ": " << r.status;
  ASSERT_EQ(static_cast<int64_t>(r.lse.size()), p.rows() * p.dims.num_q_heads);
  for (int64_t row = 0; row < p.rows(); ++row) {
    ExpectRow(p, r, row);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// The kernels that take the problem: both tiled ones always, the short-query path when
// max_q_len * group fits it.
std::vector<VarlenKernel> KernelsFor(const Problem& p) {
  const int64_t group = p.dims.num_q_heads / p.dims.num_kv_heads;
  if (p.metadata.max_q_len.value() * group <= kernels::kVarlenChunkVectors * kernels::kVarlenMaxVectorChunks) {
    return {VarlenKernel::kTiledCudaCores, VarlenKernel::kTiledTensorCores, VarlenKernel::kShortQueries};
  }
  return {VarlenKernel::kTiledCudaCores, VarlenKernel::kTiledTensorCores};
}

// Every pair of an element of `a` and one of `b`.
template <typename A, size_t kA, typename B, size_t kB>
std::vector<std::pair<A, B>> Cross(const A (&a)[kA], const B (&b)[kB]) {
  std::vector<std::pair<A, B>> pairs;
  for (const A& x : a) {
    for (const B& y : b) pairs.emplace_back(x, y);
  }
  return pairs;
}

// The kernels every batch can take: the guard tests run each.
constexpr VarlenKernel kTiledKernels[] = {VarlenKernel::kTiledCudaCores, VarlenKernel::kTiledTensorCores};

// Both KV sources give the reference's results, on every kernel that takes the problem.
void ExpectBothSourcesMatch(const Problem& p) {
  const DeviceProblem d = ToDevice(p);
  for (VarlenKernel kernel : KernelsFor(p)) {
    SCOPED_TRACE(VarlenKernelName(kernel));
    {
      SCOPED_TRACE("token-level");
      ExpectMatches(p, RunVarlen(p.dims, d, d.TokenLevel(), nullptr, kernel));
    }
    {
      SCOPED_TRACE("page table");
      ExpectMatches(p, RunVarlen(p.dims, d, d.PageLevel(), nullptr, kernel));
    }
  }
}

class VarlenGpuTest : public testing::GpuTest {};

class PageSizeVarlenGpuTest : public VarlenGpuTest, public ::testing::WithParamInterface<int64_t> {};

// Extend with cached prefixes around the page size (none, shorter than a page, several pages
// plus a partial one), query rows spanning several blocks of rows, through both kinds of
// metadata.
TEST_P(PageSizeVarlenGpuTest, ExtendMatchesTheReference) {
  const int64_t ps = GetParam();
  const Problem p = MakeExtend(Dims(32, 8, 128, KvElementType::kBf16), ps,
                               /*cached=*/{0, 5, ps + 3, 129, 300, 2 * ps - 1},
                               /*new_tokens=*/{37, 1, 2 * ps + 1, 70, 17, 1}, 200 + ps);
  SCOPED_TRACE(p.what);
  ExpectBothSourcesMatch(p);
}

// Target-verify at every page size, each mask layout.
TEST_P(PageSizeVarlenGpuTest, TargetVerifyMatchesTheReference) {
  const int64_t ps = GetParam();
  for (MaskLayout layout : {MaskLayout::kFull, MaskLayout::kQLenOnly, MaskLayout::kBitPacked}) {
    const Problem p = MakeVerify(Dims(32, 8, 128, KvElementType::kFp16), ps, {100, 1, ps + 2, 333},
                                 BinaryTrees(4, 8), 8, layout, 300 + ps);
    SCOPED_TRACE(p.what);
    ExpectBothSourcesMatch(p);
    if (HasFatalFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(PageSizes, PageSizeVarlenGpuTest, ::testing::Values(1, 7, 16, 64));

// A 4-row draft-extend (qo_indptr [0, 4, 8, ...]) over prefixes of unaligned lengths.
TEST_F(VarlenGpuTest, DraftExtendMatchesTheReference) {
  for (int64_t ps : {1, 7, 16}) {
    for (KvElementType t : {KvElementType::kBf16, KvElementType::kFp16}) {
      const Problem p = MakeDraftExtend(Dims(32, 8, 128, t), ps, {0, 3, 61, 250, 1000}, 4, 400 + ps);
      SCOPED_TRACE(p.what);
      ExpectBothSourcesMatch(p);
      if (HasFatalFailure()) return;
    }
  }
}

// Trees of other sizes: one draft token (root only), 16 (2-byte bit-packed words) and 32
// (4-byte words, the bit-packed maximum), and a chain (each token sees all before it).
TEST_F(VarlenGpuTest, VerifyTreesOfOtherSizesMatchTheReference) {
  struct Case {
    int32_t n;
    bool chain;
  };
  for (const Case& c : {Case{1, false}, Case{16, false}, Case{32, false}, Case{6, true}}) {
    std::vector<int32_t> parents = BinaryTrees(3, c.n);
    if (c.chain) {
      for (size_t e = 0; e < parents.size(); ++e) parents[e] = e % c.n == 0 ? -1 : static_cast<int32_t>(e % c.n) - 1;
    }
    for (MaskLayout layout : {MaskLayout::kFull, MaskLayout::kQLenOnly, MaskLayout::kBitPacked}) {
      const Problem p = MakeVerify(Dims(16, 4, 64, KvElementType::kBf16), 16, {45, 0, 130}, parents,
                                   c.n, layout, 500 + c.n);
      SCOPED_TRACE(p.what);
      ExpectBothSourcesMatch(p);
      if (HasFatalFailure()) return;
    }
  }
}

// GQA groups of 1 (MHA) to 16 (query heads per block 1, 2, 4, 8; a group of 16 run as two
// chunks of 8, a group of 3 as three of 1), head dims 64, 128, 256, bf16 and fp16; extend and a
// bit-packed verify.
TEST_F(VarlenGpuTest, HeadsHeadDimsAndDtypesMatchTheReference) {
  struct Shape {
    int32_t q_heads, kv_heads, head_dim;
    KvElementType dtype;
  };
  const Shape shapes[] = {
      {32, 8, 128, KvElementType::kBf16}, {64, 8, 128, KvElementType::kFp16},
      {8, 1, 64, KvElementType::kBf16},   {8, 8, 128, KvElementType::kFp16},
      {32, 8, 256, KvElementType::kFp16}, {16, 16, 64, KvElementType::kBf16},
      {12, 4, 256, KvElementType::kBf16}, {16, 1, 128, KvElementType::kFp16},
      {4, 2, 64, KvElementType::kFp16},   {8, 1, 256, KvElementType::kBf16},
      {6, 2, 128, KvElementType::kBf16},
  };
  uint64_t seed = 600;
  for (const Shape& s : shapes) {
    const DecodeAttentionDims dims = Dims(s.q_heads, s.kv_heads, s.head_dim, s.dtype);
    const Problem e = MakeExtend(dims, 16, {0, 77, 9}, {70, 19, 3}, ++seed);
    SCOPED_TRACE(e.what);
    ExpectBothSourcesMatch(e);
    const Problem v = MakeVerify(dims, 16, {50, 7}, BinaryTrees(2, 5), 5, MaskLayout::kBitPacked, ++seed);
    SCOPED_TRACE(v.what);
    ExpectBothSourcesMatch(v);
    if (HasFatalFailure()) return;
  }
}

TEST_F(VarlenGpuTest, SoftmaxScaleIsAnArgument) {
  for (float scale : {0.02f, 0.3f, 1.0f}) {
    DecodeAttentionDims dims = Dims(32, 8, 128, KvElementType::kFp16);
    dims.softmax_scale = scale;
    const Problem p = MakeExtend(dims, 16, {40, 0}, {30, 9}, 11);
    SCOPED_TRACE(::testing::Message() << p.what << ", scale " << scale);
    const DeviceProblem d = ToDevice(p);
    ExpectMatches(p, RunVarlen(p.dims, d, d.TokenLevel()));
  }
}

// Sequences with no KV (kv_len 0, q_len 0) and with a prefix but no query rows (q_len 0) among
// real ones write nothing and leave the rows around them unaffected. Built by hand from real
// extend metadata: an extend batch cannot hold a sequence with no query rows.
TEST_F(VarlenGpuTest, EmptySequencesAndSequencesWithoutRows) {
  for (int64_t ps : {1, 16}) {
    const Problem p = MakeExtend(Dims(32, 8, 128, KvElementType::kBf16), ps, {40, 10, 50}, {20, 9, 5}, 31);
    SCOPED_TRACE(p.what);
    const ForwardMetadata& m = p.metadata;
    // Batch [seq 0, empty, seq 1, seq 2 without its rows]: q holds the rows of seq 0 and 1.
    const int32_t a = m.kv_lens[0].value(), b = m.kv_lens[1].value(), c = m.kv_lens[2].value();
    const int32_t qa = m.qo_indptr[1].value(), qb = m.qo_indptr[2].value();
    const std::vector<TokenOffset> qo = {TokenOffset(0), TokenOffset(qa), TokenOffset(qa),
                                         TokenOffset(qb), TokenOffset(qb)};
    const std::vector<TokenOffset> kv = {TokenOffset(0), TokenOffset(a), TokenOffset(a),
                                         TokenOffset(a + b), TokenOffset(a + b + c)};
    const std::vector<TokenLength> lens = {TokenLength(a), TokenLength(0), TokenLength(b),
                                           TokenLength(c)};
    const int64_t cols = m.page_table.cols().value();
    std::vector<PageId> table(4 * cols, kPaddingPage);
    std::copy_n(m.page_table.span().row(0).begin(), cols, table.begin());
    std::copy_n(m.page_table.span().row(1).begin(), cols, table.begin() + 2 * cols);
    std::copy_n(m.page_table.span().row(2).begin(), cols, table.begin() + 3 * cols);
    std::vector<uint16_t> q(p.q_bits.begin(), p.q_bits.begin() + qb * p.q_row());
    const DeviceProblem e{Upload(Bytes(q)), Upload(Bytes(p.k_bits)), Upload(Bytes(p.v_bits)),
                          Upload(qo), Upload(kv), Upload(m.kv_indices), Upload(table), Upload(lens),
                          Upload(std::vector<uint8_t>{}), Upload(std::vector<int64_t>{}), PageCount(cols),
                          p.fixture->page_size(), MaskLayout::kNone, m.max_q_len};
    for (const DecodeKv& source : {e.TokenLevel(), e.PageLevel()}) {
      const Result r = RunVarlen(p.dims, e, source);
      ASSERT_TRUE(r.status.ok()) << r.status;
      for (int64_t row = 0; row < qb; ++row) ExpectRow(p, r, row);
    }
  }
}

// A row whose mask admits no position writes 0 and lse -inf, as the reference does for such a
// row; the other rows are unaffected. (A FULL mask with one row cleared on the device: the
// validator, and so the reference, refuses a row that does not see its own position.)
TEST_F(VarlenGpuTest, RowThatSeesNothingWritesZeroAndMinusInfinity) {
  const Problem p = MakeVerify(Dims(32, 8, 128, KvElementType::kBf16), 16, {20, 60},
                               BinaryTrees(2, 4), 4, MaskLayout::kFull, 41);
  SCOPED_TRACE(p.what);
  // Row 2 of sequence 1 (query row 6): bytes [2 * kv_len, 3 * kv_len) of its [4][kv_len] block.
  const int64_t kv_len = p.metadata.kv_lens[1].value();
  std::vector<uint8_t> mask(p.metadata.custom_mask);
  std::fill_n(mask.begin() + p.metadata.mask_indptr[1] + 2 * kv_len, kv_len, 0);
  DeviceProblem d = ToDevice(p);
  d.mask = Upload(mask);
  const int64_t cleared = 4 + 2;
  for (const auto& [kernel, kv] : {std::pair{VarlenKernel::kTiledCudaCores, d.TokenLevel()},
                                   std::pair{VarlenKernel::kTiledCudaCores, d.PageLevel()},
                                   std::pair{VarlenKernel::kTiledTensorCores, d.TokenLevel()},
                                   std::pair{VarlenKernel::kTiledTensorCores, d.PageLevel()},
                                   std::pair{VarlenKernel::kShortQueries, d.TokenLevel()},
                                   std::pair{VarlenKernel::kShortQueries, d.PageLevel()}}) {
    SCOPED_TRACE(VarlenKernelName(kernel));
    const Result r = RunVarlen(p.dims, d, kv, nullptr, kernel);
    ASSERT_TRUE(r.status.ok()) << r.status;
    for (int64_t row = 0; row < p.rows(); ++row) {
      if (row != cleared) ExpectRow(p, r, row);
    }
    for (int64_t x = cleared * p.q_row(); x < (cleared + 1) * p.q_row(); ++x) {
      ASSERT_EQ(r.out[x], 0.0f) << x;
    }
    for (int64_t h = 0; h < 32; ++h) ASSERT_EQ(r.lse[cleared * 32 + h], -kInf) << h;
  }
}

// Custom masks over ragged query rows in every layout: q_lens 5, 1, 0, 8, 17 (bit-packed: 4-byte
// words for a max_q_len of 17; the q_len-0 sequence inserted on the device, as no masked mode
// the validator accepts has one), random masks built by BuildMaskIndptr / BuildCustomMask,
// checked against the reference through both KV sources; and FULL masks with holes in the
// prefix (rows that skip committed positions), which the other layouts cannot express.
TEST_F(VarlenGpuTest, RaggedMaskedBatchesMatchTheReference) {
  struct Case {
    MaskLayout layout;
    bool prefix_holes;
    int64_t ps;
    DecodeAttentionDims dims;
  };
  const Case cases[] = {
      {MaskLayout::kFull, false, 16, Dims(32, 8, 128, KvElementType::kBf16)},
      {MaskLayout::kQLenOnly, false, 7, Dims(32, 8, 128, KvElementType::kFp16)},
      {MaskLayout::kBitPacked, false, 16, Dims(16, 4, 64, KvElementType::kBf16)},
      {MaskLayout::kBitPacked, false, 1, Dims(8, 8, 256, KvElementType::kFp16)},
      {MaskLayout::kFull, true, 16, Dims(32, 8, 128, KvElementType::kBf16)},
      {MaskLayout::kFull, true, 7, Dims(16, 4, 64, KvElementType::kFp16)},
  };
  uint64_t seed = 700;
  for (const Case& c : cases) {
    const Problem p = MakeMaskedExtend(c.dims, c.ps, /*cached=*/{30, 0, 7, 100},
                                       /*new_tokens=*/{5, 1, 8, 17}, c.layout, c.prefix_holes, ++seed);
    SCOPED_TRACE(p.what);
    ASSERT_EQ(p.metadata.max_q_len.value(), 17);
    ExpectBothSourcesMatch(p);
    if (HasFatalFailure()) return;
    const DeviceProblem d = ToDeviceWithEmptySequence(p, 2);
    for (VarlenKernel kernel : KernelsFor(p)) {
      for (const DecodeKv& kv : {d.TokenLevel(), d.PageLevel()}) {
        SCOPED_TRACE(::testing::Message() << "with a q_len-0 sequence at 2, " << VarlenKernelName(kernel));
        ExpectMatches(p, RunVarlen(p.dims, d, kv, nullptr, kernel));
        if (HasFatalFailure()) return;
      }
    }
  }
}

// FULL masks whose prefix has holes in some steps only: the short-query path and the tiled
// tensor-core kernel skip the per-score check on a step (tile) whose mask bytes admit every
// position for every row of the block, and must check the others. Request 0 loses positions [32, 64) of row 3 only and position 109
// of its last row, request 1 positions [64, 96) of every row and position 5 of row 0, request 2
// single positions at the ends of unaligned rows and across row 0; the steps around them are
// whole.
// The masks of trees of 8 draft tokens (32 query vectors per KV head: one block of two m-tiles)
// and of 3 (12 vectors), at head dims 128 (16-position steps) and 64 (32-position steps), with
// the holes run as extend (the validator holds target-verify's rows to the whole prefix).
TEST_F(VarlenGpuTest, FullMaskHolesInSomePrefixStepsMatchTheReference) {
  struct Case {
    int32_t n;
    DecodeAttentionDims dims;
  };
  uint64_t seed = 750;
  bool head_hole = false, tail_hole = false;
  for (const Case& c : {Case{8, Dims(32, 8, 128, KvElementType::kBf16)},
                        Case{3, Dims(32, 8, 128, KvElementType::kFp16)},
                        Case{8, Dims(16, 4, 64, KvElementType::kBf16)}}) {
    Problem p = MakeVerify(c.dims, 16, {130, 200, 256}, BinaryTrees(3, c.n), c.n, MaskLayout::kFull,
                           ++seed);
    SCOPED_TRACE(p.what);
    ForwardMetadata& md = p.metadata;
    const auto clear = [&](int64_t seq, int64_t row, int64_t from, int64_t to) {
      const int64_t kv_len = md.kv_lens[seq].value();
      ASSERT_LE(to, kv_len - c.n);  // prefix positions only
      for (int64_t col = from; col < to; ++col) md.custom_mask[md.mask_indptr[seq] + row * kv_len + col] = 0;
    };
    clear(0, 3 % c.n, 32, 64);
    for (int64_t row = 0; row < c.n; ++row) clear(1, row, 64, 96);
    clear(1, 0, 5, 6);
    // One position of the last row, past the first 8 of its step: the last lanes and rows of
    // the block's scan of its rows' mask bytes.
    clear(0, c.n - 1, 109, 110);
    // Sequence 2 (its prefix, 256, ends a step). The scan reads a row in 16-byte loads where
    // they are aligned and its two ends byte by byte (device buffers start 256-byte aligned):
    // position 0 of a row that starts unaligned, and the last prefix position of a row whose
    // unaligned end reaches back to it; in row 0, one position in each of steps 1-12 of 16,
    // at every offset from 1 to 12 in its step, so that some lie in the second half of their
    // 16-byte load.
    const int64_t kv2 = md.kv_lens[2].value();
    bool head_here = false, tail_here = false;
    for (int64_t row = 1; row < c.n; ++row) {
      const int64_t start = md.mask_indptr[2] + row * kv2;
      if (!head_here && start % 16 != 0) {
        clear(2, row, 0, 1);
        head_here = true;
      } else if (!tail_here && (start + kv2) % 16 > c.n) {
        clear(2, row, kv2 - c.n - 1, kv2 - c.n);
        tail_here = true;
      }
    }
    head_hole = head_hole || head_here;
    tail_hole = tail_hole || tail_here;
    for (int64_t k = 1; k <= 12; ++k) clear(2, 0, 17 * k, 17 * k + 1);
    // A draft tree's rows see the whole prefix, so the validator refuses these holes in
    // target-verify: the same arrays run as an extend with a custom mask, which may hide any
    // position.
    md.mode = ForwardMode::kExtend;
    p.want_lse.clear();
    FillProblem(p, seed);  // the reference again, over the mask with holes
    ExpectBothSourcesMatch(p);
    if (HasFatalFailure()) return;
  }
  EXPECT_TRUE(head_hole && tail_hole) << "no case put a hole at an unaligned row's start and end";
}

// What the host can see is refused before any launch, with nothing written: a case of each
// kind of check (every check is in varlen_attention_args_test.cc, on the CPU).
TEST_F(VarlenGpuTest, BadInputsAreRefusedBeforeLaunch) {
  const Problem p = MakeExtend(Dims(32, 8, 128, KvElementType::kBf16), 16, {10, 100, 30}, {40, 7, 20}, 71);
  const DeviceProblem d = ToDevice(p);
  const int64_t rows = p.rows();
  const int64_t q_bytes = rows * p.q_row() * 2;
  // Room for a misaligned view of the same size.
  DeviceBuffer<uint8_t> spare = *DeviceBuffer<uint8_t>::Create(q_bytes + 64);
  DeviceBuffer<uint8_t> out = *DeviceBuffer<uint8_t>::Create(q_bytes);
  DeviceBuffer<float> lse = *DeviceBuffer<float>::Create(rows * 32);
  DeviceBuffer<uint8_t> mask = *DeviceBuffer<uint8_t>::Create(4096);
  Poison(out.data(), out.size());
  Poison(lse.data(), lse.size() * sizeof(float));
  const VarlenAttentionArgs good = Args(p.dims, d, d.TokenLevel(), out, lse);

  // Checked mode: the host copy of the metadata, and one that fails validation although every
  // slot is inside the pool: sequence 0's last new token in a slot of sequence 1, without the
  // page table, which would disagree first.
  ValidationContext ctx{p.fixture->pool_slots(), p.fixture->page_size(), TokenCount(rows)};
  ctx.check_slot_ownership = true;
  const CheckedMetadata checked{p.metadata.view(), ctx};
  ForwardMetadata twice = p.metadata;
  twice.kv_indices[twice.kv_indptr[1].value() - 1] = twice.kv_indices[twice.kv_indptr[1].value()];
  twice.page_table = PageTable();
  const CheckedMetadata checked_twice{twice.view(), ctx};

  using Edit = std::function<void(VarlenAttentionArgs&)>;
  struct Case {
    const char* what;
    Edit edit;
    absl::StatusCode code;
    std::string words;  // in the message
  };
  const Case cases[] = {
      {"checked: a slot handed out twice",
       [&](VarlenAttentionArgs& a) { a.checked = &checked_twice; }, kInvalid,
       "a slot handed out twice"},
      {"heads that do not divide", [](VarlenAttentionArgs& a) { a.dims.num_kv_heads = 5; }, kInvalid,
       "num_q_heads 32 is not a positive multiple of num_kv_heads 5"},
      {"q misaligned",
       [&](VarlenAttentionArgs& a) { a.q = DeviceSpan<const uint8_t>(spare.data() + 2, q_bytes); },
       kInvalid, "must be 16-byte aligned"},
      {"null qo_indptr",
       [&](VarlenAttentionArgs& a) { a.qo_indptr = DeviceSpan<const TokenOffset>(nullptr, 4); },
       kInvalid, "qo_indptr has 4 elements but a null pointer"},
      {"max_q_len too small for the rows", [](VarlenAttentionArgs& a) { a.max_q_len = TokenCount(10); },
       kInvalid, "max_q_len 10 does not fit 67 query rows"},
      {"mask arrays without a layout",
       [&](VarlenAttentionArgs& a) { a.mask = VarlenMask{MaskLayout::kNone, mask.const_span(), {}}; },
       kInvalid, "mask arrays (4096 bytes, 0 mask_indptr entries) without a mask layout"},
      {"page table beyond int32 tokens",
       [&](VarlenAttentionArgs& a) {
         a.kv = DecodePageTableKv{d.page_table.const_span(), PageCount(int64_t{1} << 27),
                                  d.kv_lens.const_span(), d.page_size};
       },
       absl::StatusCode::kOutOfRange, "covers more than 1073741824 tokens"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    VarlenAttentionArgs a = good;
    c.edit(a);
    const absl::Status s = VarlenAttention(a, nullptr, nullptr);
    EXPECT_EQ(s.code(), c.code) << s;
    EXPECT_NE(s.message().find(c.words), absl::string_view::npos)
        << s << " does not say \"" << c.words << "\"";
  }
  ASSERT_EQ(hipDeviceSynchronize(), hipSuccess);
  const std::vector<uint8_t> got = Download(out);
  for (size_t e = 0; e < got.size(); ++e) ASSERT_EQ(got[e], 0xff) << "out written at byte " << e;
  const std::vector<float> got_lse = Download(lse);
  for (size_t e = 0; e < got_lse.size(); ++e) {
    uint32_t bits;
    std::memcpy(&bits, &got_lse[e], sizeof(bits));
    ASSERT_EQ(bits, 0xffffffffu) << "lse written at " << e;
  }
  // The unedited arguments run, also checked.
  ASSERT_TRUE(VarlenAttention(good, nullptr, nullptr).ok());
  VarlenAttentionArgs checked_args = good;
  checked_args.checked = &checked;
  EXPECT_TRUE(VarlenAttention(checked_args, nullptr, nullptr).ok());
  ASSERT_EQ(hipDeviceSynchronize(), hipSuccess);
}

class OverlapVarlenGpuTest : public testing::ViolationWordGpuTest {
 protected:
  // The recorded violation, then clears the word for the next launch.
  absl::Status Violations() {
    const absl::Status s = word_->Check(nullptr);
    EXPECT_TRUE(word_->Reset(nullptr).ok());
    return s;
  }
};

// Q, the K and V pools and the KV source's indices or page table hold zeros until a kernel
// ahead writes them at its end; then, in a second round, the metadata a block reads first to
// find its rows (qo_indptr, the KV lengths or indptr, the FULL mask and its indptr). A launch
// overlapping that kernel (the default) waits for it before it reads anything: on every kernel
// path, through both KV sources, causal extend, a FULL-mask verify and an extend whose query
// tensor has a tail of rows no sequence claims (zero_unclaimed_rows), on the stream and
// captured in a graph (one programmatic edge where launches overlap), its results are those of
// a plain launch on the real inputs.
TEST_F(OverlapVarlenGpuTest, OverlappingLaunchWaitsForTheKernelAheadThatWritesItsInputs) {
  if (testing::LaunchesOverlap()) {
    hipStream_t stream = nullptr;
    ASSERT_EQ(hipStreamCreate(&stream), hipSuccess);
    testing::ExpectAnOverlappingProbeStartsFirst(stream);
    EXPECT_EQ(hipStreamDestroy(stream), hipSuccess);
  }
  struct Case {
    Problem p;
    int64_t tail;  // rows of q past qo_indptr[bs], declared with zero_unclaimed_rows
  };
  std::vector<Case> cases;
  cases.push_back({MakeExtend(Dims(32, 8, 128, KvElementType::kBf16), 16, /*cached=*/{0, 40, 300},
                              /*new_tokens=*/{37, 70, 17}, 801),
                   0});
  cases.push_back({MakeVerify(Dims(32, 8, 128, KvElementType::kFp16), 16, {100, 1, 18, 333},
                              BinaryTrees(4, 8), 8, MaskLayout::kFull, 802),
                   0});
  // A captured variable-row extend: 7 rows past the 17 the sequences claim (max_q_len 8).
  cases.push_back({MakeExtend(Dims(32, 8, 128, KvElementType::kBf16), 16, /*cached=*/{20, 50, 9},
                              /*new_tokens=*/{8, 3, 6}, 803),
                   7});
  for (const Case& c : cases) {
    const Problem& p = c.p;
    SCOPED_TRACE(::testing::Message() << p.what << ", tail " << c.tail);
    DeviceProblem d = ToDevice(p);
    if (c.tail > 0) {
      std::vector<uint16_t> q(p.q_bits);
      q.resize((p.rows() + c.tail) * p.q_row(), 0x3f80);  // 1.0 in bf16
      d.q = Upload(Bytes(q));
    }
    DeviceBuffer<uint8_t> out = *DeviceBuffer<uint8_t>::Create(d.q.size());
    DeviceBuffer<float> lse =
        *DeviceBuffer<float>::Create((p.rows() + c.tail) * p.dims.num_q_heads);
    for (VarlenKernel kernel : KernelsFor(p)) {
      for (bool page_table : {false, true}) {
        SCOPED_TRACE(::testing::Message() << VarlenKernelName(kernel)
                                          << (page_table ? ", page table" : ", token-level"));
        const DecodeKv kv = page_table ? d.PageLevel() : d.TokenLevel();
        const testing::DeviceBytes indices =
            page_table ? testing::BytesOf(d.page_table) : testing::BytesOf(d.kv_indices);
        std::vector<testing::DeviceBytes> metadata = {
            testing::BytesOf(d.qo_indptr),
            page_table ? testing::BytesOf(d.kv_lens) : testing::BytesOf(d.kv_indptr)};
        if (d.layout == MaskLayout::kFull) {
          metadata.push_back(testing::BytesOf(d.mask_indptr));
          metadata.push_back(testing::BytesOf(d.mask));
        }
        const auto launch = [&](bool overlap, hipStream_t stream) {
          VarlenAttentionArgs a = Args(p.dims, d, kv, out, lse);
          a.kernel = kernel;
          a.overlap_preceding_kernel = overlap;
          a.zero_unclaimed_rows = c.tail > 0;
          return VarlenAttention(a, word_->device(), stream);
        };
        const struct {
          const char* what;
          std::vector<testing::DeviceBytes> inputs;
        } rounds[] = {{"Q, K, V and the indices written late",
                       {testing::BytesOf(d.q), testing::BytesOf(d.k), testing::BytesOf(d.v), indices}},
                      {"the metadata written late", metadata}};
        for (const auto& r : rounds) {
          SCOPED_TRACE(r.what);
          testing::ExpectTheLaunchWaitsForItsInputs(
              r.inputs, {testing::BytesOf(out), testing::BytesOf(lse)}, 1, launch,
              [&] { return Violations(); });
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

// Corrupted device-resident metadata: the kernel stays in bounds (memcheck), skips what it
// cannot read, and the violation word names the first problem.
class GuardVarlenGpuTest : public testing::ViolationWordGpuTest {};

// Every output element finite, or still the poison (a row no sequence claims once qo_indptr is
// clamped).
void ExpectNoGarbage(const Result& r) {
  for (size_t e = 0; e < r.out.size(); ++e) {
    ASSERT_TRUE(std::isfinite(r.out[e]) || r.out_bytes[2 * e] == 0xff) << "out " << e;
  }
}

// A sequence whose rows see nothing: 0 and -inf.
void ExpectBlind(const Problem& p, const Result& r, int64_t i) {
  for (int64_t row = p.metadata.qo_indptr[i].value(); row < p.metadata.qo_indptr[i + 1].value(); ++row) {
    for (int64_t x = row * p.q_row(); x < (row + 1) * p.q_row(); ++x) ASSERT_EQ(r.out[x], 0.0f) << x;
    for (int64_t h = 0; h < p.dims.num_q_heads; ++h) ASSERT_EQ(r.lse[row * p.dims.num_q_heads + h], -kInf);
  }
}

TEST_F(GuardVarlenGpuTest, BrokenQoIndptrIsClampedAndRecorded) {
  // q_lens 40, 7, 20 over kv_lens 50, 107, 50.
  const Problem p = MakeExtend(Dims(32, 8, 128, KvElementType::kBf16), 16, {10, 100, 30}, {40, 7, 20}, 81);
  SCOPED_TRACE(p.what);
  const int32_t rows = static_cast<int32_t>(p.rows());
  struct Case {
    std::vector<int32_t> qo;
    std::string words;
    std::vector<int64_t> intact;     // sequences whose rows are still the reference's
    std::vector<int64_t> unclaimed;  // rows no sequence claims: still the poison
  } cases[] = {
      // Sequence 2 starts back at row 30: it and sequence 0 both write rows 30..39.
      {{0, 40, 30, rows}, "below the entry before it", {}, {}},
      {{0, 40, 47, rows + 5000}, "rows of the query tensor", {0, 1}, {}},
      {{-8, 40, 47, rows}, "qo_indptr entry 0: -8 is negative", {0, 1, 2}, {}},
      {{0, 2, 47, rows}, "45 query rows, past the max_q_len 40", {2}, {}},  // over kv_len 107
      // Rows 0..4 and the last 3 rows: claimed by no sequence (qo_indptr from the wrong array).
      {{5, 40, 47, rows}, "qo_indptr entry 0: 5, want 0: query rows no sequence claims", {1, 2},
       {0, 1, 2, 3, 4}},
      {{0, 40, 47, rows - 3},
       absl::StrCat("qo_indptr entry 3: ", rows - 3, ", want ", rows, ": query rows no sequence"),
       {0, 1}, {rows - 3, rows - 2, rows - 1}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.words);
    std::vector<TokenOffset> qo;
    for (int32_t x : c.qo) qo.push_back(TokenOffset(x));
    DeviceProblem e = ToDevice(p);
    e.qo_indptr = Upload(qo);
    for (VarlenKernel kernel : kTiledKernels) {
      SCOPED_TRACE(VarlenKernelName(kernel));
      for (const DecodeKv& kv : {e.TokenLevel(), e.PageLevel()}) {
        const Result r = RunVarlen(p.dims, e, kv, word_->device(), kernel);
        ASSERT_TRUE(r.status.ok()) << r.status;
        ExpectViolation(c.words);
        ExpectNoGarbage(r);
        for (int64_t i : c.intact) ExpectSequence(p, r, i);
        for (int64_t row : c.unclaimed) {
          for (int64_t x = row * p.q_row(); x < (row + 1) * p.q_row(); ++x) {
            ASSERT_EQ(r.out_bytes[2 * x], 0xff) << "row " << row << " written";
          }
        }
      }
    }
  }
}

// A captured variable-row extend's tail: q holds as many rows past qo_indptr[bs] as the grid
// allows (bs * max_q_len in all), claimed by no sequence. With zero_unclaimed_rows every kernel
// writes them 0 and -inf and records nothing, and the claimed rows are the reference's;
// without it they keep the poison and kQueryRowsMismatch is recorded.
TEST_F(GuardVarlenGpuTest, UnclaimedTailRowsAreZeroedOnlyWhenTheLaunchExpectsThem) {
  const DecodeAttentionDims dims = Dims(32, 8, 128, KvElementType::kBf16);
  // The tiled kernels (max_q_len 40), and the short-query path too (max_q_len 4 and 16: one
  // and four chunks of 16 query vectors).
  std::vector<Problem> problems;
  problems.push_back(MakeExtend(dims, 16, {10, 100, 30}, {40, 7, 20}, 87));
  problems.push_back(MakeExtend(dims, 7, {30, 50, 20}, {4, 1, 3}, 88));
  // 4 chunks of 16 vectors, two blocks per sequence and KV head: sequence 1's second is empty.
  problems.push_back(MakeExtend(dims, 64, {100, 5, 60}, {16, 2, 5}, 90));
  for (const Problem& p : problems) {
    SCOPED_TRACE(p.what);
    const int64_t bs = p.bs();
    const int64_t claimed = p.rows();
    const int64_t rows = bs * p.metadata.max_q_len.value();
    ASSERT_GT(rows, claimed);
    DeviceProblem e = ToDevice(p);
    std::vector<uint16_t> q(p.q_bits);
    q.resize(rows * p.q_row(), 0x3f80);  // 1.0 in bf16: a tail that would attend to something
    e.q = Upload(Bytes(q));
    for (VarlenKernel kernel : KernelsFor(p)) {
      for (const DecodeKv& kv : {e.TokenLevel(), e.PageLevel()}) {
        for (bool zero : {true, false}) {
          SCOPED_TRACE(::testing::Message()
                       << VarlenKernelName(kernel) << (zero ? ", zeroed" : ", not zeroed"));
          const Result r = RunVarlen(p.dims, e, kv, word_->device(), kernel, zero);
          ASSERT_TRUE(r.status.ok()) << r.status;
          ASSERT_EQ(static_cast<int64_t>(r.lse.size()), rows * p.dims.num_q_heads);
          for (int64_t row = 0; row < claimed; ++row) {
            ExpectRow(p, r, row);
            ASSERT_FALSE(HasFatalFailure());
          }
          if (zero) {
            EXPECT_TRUE(word_->Check(nullptr).ok()) << word_->Check(nullptr);
          } else {
            ExpectViolation(absl::StrCat("qo_indptr entry ", bs, ": ", claimed, ", want ", rows,
                                         ": query rows no sequence claims"));
          }
          for (int64_t x = claimed * p.q_row(); x < rows * p.q_row(); ++x) {
            if (zero) {
              ASSERT_EQ(r.out[x], 0.0f) << "out " << x;
            } else {
              ASSERT_EQ(r.out_bytes[2 * x], 0xff) << "out " << x << " written";
            }
          }
          for (int64_t x = claimed * p.dims.num_q_heads; x < rows * p.dims.num_q_heads; ++x) {
            if (zero) {
              ASSERT_EQ(r.lse[x], -kInf) << "lse " << x;
            } else {
              ASSERT_TRUE(std::isnan(r.lse[x])) << "lse " << x << " written";
            }
          }
        }
      }
    }
  }
}

// A declared tail whose start cannot be trusted: qo_indptr[bs] negative, below the entry
// before it, or past the rows of q. The kernel writes no tail (the rows after the last sequence
// that claims rows keep the poison) and stays in bounds; the entry is recorded.
TEST_F(GuardVarlenGpuTest, DeclaredTailAfterABrokenLastEntryIsNotWritten) {
  const Problem p =
      MakeExtend(Dims(32, 8, 128, KvElementType::kBf16), 16, {10, 100, 30}, {40, 7, 20}, 89);
  SCOPED_TRACE(p.what);
  const int32_t rows = static_cast<int32_t>(p.rows());
  const std::vector<int32_t> cases[] = {{0, 40, 47, -5}, {0, 40, 47, 30}, {0, 40, 47, rows + 5000}};
  for (const std::vector<int32_t>& c : cases) {
    SCOPED_TRACE(::testing::Message() << "qo_indptr[3] " << c[3]);
    std::vector<TokenOffset> qo;
    for (int32_t x : c) qo.push_back(TokenOffset(x));
    DeviceProblem e = ToDevice(p);
    e.qo_indptr = Upload(qo);
    for (VarlenKernel kernel : kTiledKernels) {
      SCOPED_TRACE(VarlenKernelName(kernel));
      for (const DecodeKv& kv : {e.TokenLevel(), e.PageLevel()}) {
        const Result r =
            RunVarlen(p.dims, e, kv, word_->device(), kernel, /*zero_unclaimed_rows=*/true);
        ASSERT_TRUE(r.status.ok()) << r.status;
        EXPECT_FALSE(word_->Check(nullptr).ok()) << "the broken entry is recorded";
        EXPECT_TRUE(word_->Reset(nullptr).ok());
        ExpectNoGarbage(r);
        ExpectSequence(p, r, 0);
        ExpectSequence(p, r, 1);
        if (c[3] > rows) continue;  // sequence 2 is clamped to the rows of q: it claims them all
        for (int64_t x = 47 * p.q_row(); x < rows * p.q_row(); ++x) {
          ASSERT_EQ(r.out_bytes[2 * x], 0xff) << "out " << x << " written";
        }
        for (int64_t x = 47 * p.dims.num_q_heads; x < rows * p.dims.num_q_heads; ++x) {
          ASSERT_TRUE(std::isnan(r.lse[x])) << "lse " << x << " written";
        }
      }
    }
  }
}

TEST_F(GuardVarlenGpuTest, LengthsPastTheirBuffersAreClampedAndRecorded) {
  const Problem p = MakeExtend(Dims(32, 8, 128, KvElementType::kFp16), 16, {10, 100, 30}, {40, 7, 20}, 91);
  SCOPED_TRACE(p.what);
  const DeviceProblem d = ToDevice(p);
  const int32_t total = p.metadata.kv_indptr.back().value();
  // kv_indptr: past kv_indices, decreasing, negative.
  struct IndptrCase {
    std::vector<int32_t> indptr;
    const char* words;
    std::vector<int64_t> intact;  // sequences whose KV range is unchanged
  } indptr_cases[] = {
      {{0, 50, 157, total + 5000}, "the buffer holds", {0, 1}},
      {{0, 50, 20, total}, "below the entry", {0}},
      {{-40, 50, 157, total}, "kv_indptr entry 0: -40 is negative", {0, 1, 2}},  // clamped to 0
  };
  for (const auto& [c, kernel] : Cross(indptr_cases, kTiledKernels)) {
    SCOPED_TRACE(::testing::Message() << c.words << ", " << VarlenKernelName(kernel));
    std::vector<TokenOffset> indptr;
    for (int32_t x : c.indptr) indptr.push_back(TokenOffset(x));
    DeviceBuffer<TokenOffset> d_indptr = Upload(indptr);
    const Result r = RunVarlen(p.dims, d, DecodeTokenLevelKv{d_indptr.const_span(), d.kv_indices.const_span()},
                               word_->device(), kernel);
    ASSERT_TRUE(r.status.ok()) << r.status;
    ExpectViolation(c.words);
    ExpectNoGarbage(r);
    for (int64_t i : c.intact) ExpectSequence(p, r, i);
  }
  // kv_lens: past the table's columns, negative, and below q_len (sequence 1 sees nothing).
  struct LensCase {
    std::vector<int32_t> lens;
    const char* words;
  } lens_cases[] = {
      {{50, 100000, 50}, "columns"},
      {{50, 107, -3}, "is negative"},
      {{50, 3, 50}, "7 query rows over 3 KV tokens"},
  };
  for (const auto& [c, kernel] : Cross(lens_cases, kTiledKernels)) {
    SCOPED_TRACE(::testing::Message() << c.words << ", " << VarlenKernelName(kernel));
    std::vector<TokenLength> lens;
    for (int32_t x : c.lens) lens.push_back(TokenLength(x));
    DeviceBuffer<TokenLength> d_lens = Upload(lens);
    const Result r = RunVarlen(p.dims, d, DecodePageTableKv{d.page_table.const_span(), d.cols, d_lens.const_span(),
                                                      d.page_size},
                               word_->device(), kernel);
    ASSERT_TRUE(r.status.ok()) << r.status;
    ExpectViolation(c.words);
    ExpectNoGarbage(r);
    ExpectSequence(p, r, 0);
    if (c.lens[1] == 3) ExpectBlind(p, r, 1);
    ExpectSequence(p, r, c.lens[2] < 0 ? 1 : 2);  // the one of 1, 2 left intact
  }
}

TEST_F(GuardVarlenGpuTest, SlotsOutsideThePoolAreSkippedAndRecorded) {
  const Problem p = MakeExtend(Dims(32, 8, 128, KvElementType::kBf16), 16, {60, 10, 30}, {40, 7, 20}, 101);
  SCOPED_TRACE(p.what);
  const int64_t pool_slots = p.fixture->pool_slots().value();
  const int32_t bad_slots[] = {1 << 30, -7, static_cast<int32_t>(pool_slots)};
  for (const auto& [bad, kernel] : Cross(bad_slots, kTiledKernels)) {
    SCOPED_TRACE(::testing::Message() << "slot " << bad << ", " << VarlenKernelName(kernel));
    std::vector<TokenSlot> indices(p.metadata.kv_indices);
    indices[37] = TokenSlot(bad);  // position 37 of sequence 0
    DeviceProblem e = ToDevice(p);
    e.kv_indices = Upload(indices);
    const Result r = RunVarlen(p.dims, e, e.TokenLevel(), word_->device(), kernel);
    ASSERT_TRUE(r.status.ok()) << r.status;
    ExpectViolation("outside the pool");
    for (float x : r.out) ASSERT_TRUE(std::isfinite(x));
    ExpectSequence(p, r, 1);
    ExpectSequence(p, r, 2);
  }
  // A page outside the pool, through the page table (row 1's first page).
  std::vector<PageId> table(p.metadata.page_table.span().entries().begin(),
                            p.metadata.page_table.span().entries().end());
  table[p.metadata.page_table.cols().value()] = PageId(1 << 29);
  DeviceProblem e = ToDevice(p);
  e.page_table = Upload(table);
  for (VarlenKernel kernel : kTiledKernels) {
    SCOPED_TRACE(VarlenKernelName(kernel));
    const Result r = RunVarlen(p.dims, e, e.PageLevel(), word_->device(), kernel);
    ASSERT_TRUE(r.status.ok()) << r.status;
    ExpectViolation("outside the pool");
    for (float x : r.out) ASSERT_TRUE(std::isfinite(x));
    ExpectSequence(p, r, 0);
    ExpectSequence(p, r, 2);
  }
}

// A slot or page outside the pool early in a long cached prefix: the tile holding it is the
// only one of the prefix with a position that is not read, and the tensor-core tiled kernel,
// which skips the per-score checks on whole tiles, must skip that position exactly as the
// CUDA-core kernel does (the two agree on every row), at every head dim (tiles of 128, 64 and
// 32 positions); the other sequence matches the reference.
TEST_F(GuardVarlenGpuTest, PositionOutsideThePoolInALongPrefixIsSkippedByBothTiledKernels) {
  uint64_t seed = 130;
  for (const DecodeAttentionDims& dims : {Dims(16, 4, 64, KvElementType::kBf16),
                                          Dims(32, 8, 128, KvElementType::kBf16),
                                          Dims(8, 8, 256, KvElementType::kFp16)}) {
    const Problem p = MakeExtend(dims, 16, /*cached=*/{700, 30}, /*new_tokens=*/{40, 9}, ++seed);
    SCOPED_TRACE(p.what);
    std::vector<TokenSlot> indices(p.metadata.kv_indices);
    indices[5] = TokenSlot(1 << 30);  // position 5 of sequence 0
    std::vector<PageId> table(p.metadata.page_table.span().entries().begin(),
                              p.metadata.page_table.span().entries().end());
    table[1] = PageId(-4);  // positions 16..31 of sequence 0
    DeviceProblem e = ToDevice(p);
    e.kv_indices = Upload(indices);
    e.page_table = Upload(table);
    for (const DecodeKv& kv : {e.TokenLevel(), e.PageLevel()}) {
      SCOPED_TRACE(kv.index() == 0 ? "token-level" : "page table");
      const Result cuda_cores = RunVarlen(p.dims, e, kv, word_->device(), VarlenKernel::kTiledCudaCores);
      ASSERT_TRUE(cuda_cores.status.ok()) << cuda_cores.status;
      ExpectViolation("outside the pool");
      const Result tensor_cores =
          RunVarlen(p.dims, e, kv, word_->device(), VarlenKernel::kTiledTensorCores);
      ASSERT_TRUE(tensor_cores.status.ok()) << tensor_cores.status;
      ExpectViolation("outside the pool");
      ExpectSequence(p, tensor_cores, 1);
      const bool bf16 = p.dims.dtype == KvElementType::kBf16;
      for (size_t x = 0; x < cuda_cores.out.size(); ++x) {
        ASSERT_TRUE(Near(tensor_cores.out[x], cuda_cores.out[x], bf16 ? 1e-2 : 2e-3, bf16 ? 1e-2 : 2e-3))
            << "element " << x << ": " << tensor_cores.out[x] << " against " << cuda_cores.out[x];
      }
      for (size_t x = 0; x < cuda_cores.lse.size(); ++x) {
        ASSERT_TRUE(Near(tensor_cores.lse[x], cuda_cores.lse[x], 1e-3, 1e-5)) << "lse " << x;
      }
    }
  }
}

// A mask block that does not fit in the mask (mask_indptr past it, or negative): its sequence
// sees nothing, the others are unaffected.
TEST_F(GuardVarlenGpuTest, MaskBlocksOutsideTheMaskAreRecorded) {
  for (MaskLayout layout : {MaskLayout::kFull, MaskLayout::kQLenOnly, MaskLayout::kBitPacked}) {
    const Problem p = MakeVerify(Dims(32, 8, 128, KvElementType::kBf16), 16, {30, 90, 5},
                                 BinaryTrees(3, 8), 8, layout, 111);
    SCOPED_TRACE(p.what);
    for (int64_t bad : {int64_t{1} << 40, int64_t{-64}, p.metadata.mask_indptr[3] - 1}) {
      SCOPED_TRACE(::testing::Message() << "mask_indptr[2] = " << bad);
      std::vector<int64_t> indptr(p.metadata.mask_indptr);
      indptr[2] = bad;
      DeviceProblem e = ToDevice(p);
      e.mask_indptr = Upload(indptr);
      for (VarlenKernel kernel : KernelsFor(p)) {
        SCOPED_TRACE(VarlenKernelName(kernel));
        const Result r = RunVarlen(p.dims, e, e.PageLevel(), word_->device(), kernel);
        ASSERT_TRUE(r.status.ok()) << r.status;
        ExpectViolation("does not fit in the mask");
        ExpectSequence(p, r, 0);
        ExpectSequence(p, r, 1);
        ExpectBlind(p, r, 2);
      }
    }
    // A mask shorter than mask_indptr says: the last block does not fit.
    DeviceProblem e = ToDevice(p);
    std::vector<uint8_t> short_mask(p.metadata.custom_mask.begin(), p.metadata.custom_mask.end() - 1);
    e.mask = Upload(short_mask);
    for (VarlenKernel kernel : KernelsFor(p)) {
      SCOPED_TRACE(VarlenKernelName(kernel));
      const Result r = RunVarlen(p.dims, e, e.TokenLevel(), word_->device(), kernel);
      ASSERT_TRUE(r.status.ok()) << r.status;
      ExpectViolation("does not fit in the mask");
      ExpectSequence(p, r, 0);
      ExpectSequence(p, r, 1);
      ExpectBlind(p, r, 2);
    }
  }
}

// The tensor cores' short-query path under corrupted device metadata (a verify batch): a slot
// or page outside the pool is skipped and recorded, a q_len past max_q_len makes its sequence
// see nothing, rows no sequence claims stay unwritten; the other sequences are unaffected.
TEST_F(GuardVarlenGpuTest, TensorCorePathGuards) {
  const Problem p = MakeVerify(Dims(32, 8, 128, KvElementType::kBf16), 16, {30, 90, 5},
                               BinaryTrees(3, 8), 8, MaskLayout::kBitPacked, 121);
  SCOPED_TRACE(p.what);
  {
    std::vector<TokenSlot> indices(p.metadata.kv_indices);
    indices[p.metadata.kv_indptr[1].value() + 3] = TokenSlot(1 << 30);  // sequence 1
    DeviceProblem e = ToDevice(p);
    e.kv_indices = Upload(indices);
    const Result r = RunVarlen(p.dims, e, e.TokenLevel(), word_->device(), VarlenKernel::kShortQueries);
    ASSERT_TRUE(r.status.ok()) << r.status;
    ExpectViolation("outside the pool");
    for (float x : r.out) ASSERT_TRUE(std::isfinite(x));
    ExpectSequence(p, r, 0);
    ExpectSequence(p, r, 2);
  }
  {
    std::vector<PageId> table(p.metadata.page_table.span().entries().begin(),
                              p.metadata.page_table.span().entries().end());
    table[0] = PageId(-3);  // sequence 0's first page
    DeviceProblem e = ToDevice(p);
    e.page_table = Upload(table);
    const Result r = RunVarlen(p.dims, e, e.PageLevel(), word_->device(), VarlenKernel::kShortQueries);
    ASSERT_TRUE(r.status.ok()) << r.status;
    ExpectViolation("outside the pool");
    for (float x : r.out) ASSERT_TRUE(std::isfinite(x));
    ExpectSequence(p, r, 1);
    ExpectSequence(p, r, 2);
  }
  {
    // Rows 0..2 claimed by no sequence; sequence 0 then has 5 rows.
    std::vector<TokenOffset> qo(p.metadata.qo_indptr);
    qo[0] = TokenOffset(3);
    DeviceProblem e = ToDevice(p);
    e.qo_indptr = Upload(qo);
    const Result r = RunVarlen(p.dims, e, e.PageLevel(), word_->device(), VarlenKernel::kShortQueries);
    ASSERT_TRUE(r.status.ok()) << r.status;
    ExpectViolation("query rows no sequence claims");
    ExpectSequence(p, r, 1);
    ExpectSequence(p, r, 2);
    for (int64_t x = 0; x < 3 * p.q_row(); ++x) ASSERT_EQ(r.out_bytes[2 * x], 0xff) << x;
  }
}

}  // namespace
}  // namespace attnmeta
