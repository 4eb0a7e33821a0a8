// VarlenAttentionLaunchFor on the CPU: every check the varlen launcher makes before it
// launches, the kernel it picks and the grid it launches. The spans point into host memory:
// the checks never read through them (varlen_attention_args.h).

#include "attention/kernels/varlen_attention_args.h"

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "attention/kernels/checked_metadata.h"
#include "attention/kernels/device_span.h"
#include "attention/kernels/testing/host_buffer.h"
#include "attention/kernels/varlen_attention.h"
#include "attention/metadata/builders.h"
#include "attention/metadata/custom_mask.h"
#include "attention/metadata/forward_metadata.h"
#include "attention/metadata/testing/batch_fixture.h"
#include "attention/metadata/validator.h"
#include "gtest/gtest.h"
#include "kvcache/units.h"

namespace attnmeta {
namespace {

using testing::BatchFixture;
using testing::HostBuffer;
using testing::HostSpan;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

// An extend batch (page size 16, 32 query / 8 KV heads, head dim 128, bf16): cached prefixes of
// 10, 100 and 30 tokens and 40, 7 and 20 new ones (67 query rows, max_q_len 40), its host
// metadata and host buffers of the launch's sizes.
class VarlenAttentionArgsTest : public ::testing::Test {
 protected:
  static constexpr int32_t kQHeads = 32;
  static constexpr int32_t kKvHeads = 8;
  static constexpr int32_t kHeadDim = 128;
  static constexpr int64_t kQRow = kQHeads * kHeadDim * 2;  // bytes

  VarlenAttentionArgsTest()
      : fixture_(16, /*seed=*/71, /*num_pages=*/64, /*max_reqs=*/8, /*max_context=*/256) {
    const int64_t cached[] = {10, 100, 30}, new_tokens[] = {40, 7, 20};
    for (int j = 0; j < 3; ++j) fixture_.AddSequence(cached[j], new_tokens[j]);
    absl::StatusOr<ForwardMetadata> m = BuildForwardMetadata(
        fixture_.Batch(ForwardMode::kExtend), fixture_.pool(), fixture_.page_size());
    EXPECT_TRUE(m.ok()) << m.status();
    metadata_ = *std::move(m);
    rows_ = fixture_.num_query_rows().value();
    pool_bytes_ = fixture_.pool_slots().value() * kKvHeads * kHeadDim * 2;
    const absl::Span<const PageId> table = metadata_.page_table.span().entries();
    page_table_.assign(table.begin(), table.end());
    q_ = HostBuffer(rows_ * kQRow);
    out_ = HostBuffer(rows_ * kQRow);
    lse_ = HostBuffer(rows_ * kQHeads * 4);
    k_ = HostBuffer(pool_bytes_);
    v_ = HostBuffer(pool_bytes_);
    mask_ = HostBuffer(4096);
    mask_indptr_ = HostBuffer(5 * 8);
  }

  DecodeKv TokenLevel() const {
    return DecodeTokenLevelKv{HostSpan(metadata_.kv_indptr), HostSpan(metadata_.kv_indices)};
  }
  DecodeKv PageLevel() const {
    return DecodePageTableKv{HostSpan(page_table_), PageCount(metadata_.page_table.cols()),
                             HostSpan(metadata_.kv_lens), fixture_.page_size()};
  }
  VarlenMask Full() {
    return VarlenMask{MaskLayout::kFull, mask_.span<const uint8_t>(),
                      mask_indptr_.span<const int64_t>(0, 4)};
  }

  // Arguments that pass: causal extend through token-level KV.
  VarlenAttentionArgs Good() {
    VarlenAttentionArgs a;
    a.dims.num_q_heads = kQHeads;
    a.dims.num_kv_heads = kKvHeads;
    a.dims.head_dim = kHeadDim;
    a.dims.dtype = KvElementType::kBf16;
    a.dims.softmax_scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
    a.q = q_.span<const uint8_t>();
    a.qo_indptr = HostSpan(metadata_.qo_indptr);
    a.max_q_len = TokenCount(40);
    a.k_pool = k_.span<const uint8_t>();
    a.v_pool = v_.span<const uint8_t>();
    a.kv = TokenLevel();
    a.out = out_.span<uint8_t>();
    a.lse = lse_.span<float>();
    return a;
  }

  BatchFixture fixture_;
  ForwardMetadata metadata_;
  std::vector<PageId> page_table_;
  int64_t rows_ = 0;
  int64_t pool_bytes_ = 0;
  HostBuffer q_, out_, lse_, k_, v_, mask_, mask_indptr_;
};

// The short-query path's blocks per (sequence, KV head): two chunks a block where there are
// several at head dims up to 128, one at 256 (the launcher's grid and the kernel's both).
TEST(VarlenShortQueryBlocksTest, TwoChunksABlockUpToHeadDim128) {
  EXPECT_EQ(kernels::VarlenShortQueryBlocks(128, 1), 1);
  EXPECT_EQ(kernels::VarlenShortQueryBlocks(64, 2), 1);
  EXPECT_EQ(kernels::VarlenShortQueryBlocks(128, 3), 2);
  EXPECT_EQ(kernels::VarlenShortQueryBlocks(128, 4), 2);
  EXPECT_EQ(kernels::VarlenShortQueryBlocks(256, 3), 3);
  EXPECT_EQ(kernels::VarlenShortQueryBlocks(256, 4), 4);
}

TEST_F(VarlenAttentionArgsTest, TheGridAndTheKernelEachPathGets) {
  // The tiled paths: 3 sequences x ceil(40 / rows per block) tiles x 8 chunks of 4 query heads.
  for (bool native_mma : {false, true}) {
    SCOPED_TRACE(native_mma ? "native mma" : "portable mma");
    kernels::DeviceViolation violation{};
    absl::StatusOr<VarlenAttentionLaunch> launch =
        VarlenAttentionLaunchFor(Good(), native_mma, &violation);
    ASSERT_TRUE(launch.ok()) << launch.status();
    const kernels::VarlenAttentionParams& p = launch->params;
    EXPECT_EQ(p.violation, &violation);
    EXPECT_EQ(p.q, q_.data());
    EXPECT_EQ(p.k_pool, k_.data());
    EXPECT_EQ(p.v_pool, v_.data());
    EXPECT_EQ(p.out, out_.data());
    EXPECT_EQ(p.lse, reinterpret_cast<float*>(lse_.data()));
    EXPECT_EQ(p.qo_indptr, reinterpret_cast<const int32_t*>(metadata_.qo_indptr.data()));
    EXPECT_EQ(p.num_q_heads, kQHeads);
    EXPECT_EQ(p.num_kv_heads, kKvHeads);
    EXPECT_EQ(p.head_dim, kHeadDim);
    EXPECT_EQ(p.dtype, kernels::kElementBf16);
    EXPECT_EQ(p.softmax_scale, 1.0f / std::sqrt(static_cast<float>(kHeadDim)));
    EXPECT_EQ(p.kv.page_level, 0);
    EXPECT_EQ(p.tiled_tensor_cores, native_mma ? 1 : 0);
    EXPECT_EQ(p.vector_chunks, 0);
    EXPECT_EQ(p.heads_per_block, 4);
    // Head dim 128, 4 query heads a block: 32 query rows a block on the tensor cores (128
    // vectors), 16 on the portable path (64): max_q_len 40 is 2 or 3 tiles, times 3 sequences
    // and 8 blocks of heads.
    EXPECT_EQ(p.q_tiles, native_mma ? 2 : 3);
    EXPECT_EQ(launch->blocks, native_mma ? 48 : 72);
    EXPECT_EQ(p.q_rows, rows_);
    EXPECT_EQ(p.max_q_len, 40);
    EXPECT_EQ(p.batch_size, 3);
    EXPECT_EQ(p.mask_layout, kernels::kVarlenCausal);
    EXPECT_EQ(p.kv.pool_slots, fixture_.pool_slots().value());
  }
  // The short-query path: vector chunks of max_q_len x group per KV head.
  VarlenAttentionArgs a = Good();
  a.kernel = VarlenKernel::kShortQueries;
  a.max_q_len = TokenCount(40);
  a.dims.num_q_heads = kKvHeads;  // MHA: a group of 1
  a.q = q_.span<const uint8_t>(0, static_cast<size_t>(rows_ * kKvHeads * kHeadDim * 2));
  a.out = out_.span<uint8_t>(0, static_cast<size_t>(rows_ * kKvHeads * kHeadDim * 2));
  a.lse = lse_.span<float>(0, static_cast<size_t>(rows_ * kKvHeads));
  absl::StatusOr<VarlenAttentionLaunch> launch = VarlenAttentionLaunchFor(a, true, nullptr);
  ASSERT_TRUE(launch.ok()) << launch.status();
  const int64_t chunks = (40 + kernels::kVarlenChunkVectors - 1) / kernels::kVarlenChunkVectors;
  EXPECT_EQ(launch->params.vector_chunks, chunks);
  // Three chunks, two a block at head dim 128: two blocks per sequence and KV head.
  ASSERT_EQ(chunks, 3);
  ASSERT_LE(kHeadDim, 128);
  EXPECT_EQ(launch->blocks, 3 * kKvHeads * 2);
  // kAuto takes it too where max_q_len x group is short.
  a.kernel = VarlenKernel::kAuto;
  launch = VarlenAttentionLaunchFor(a, true, nullptr);
  ASSERT_TRUE(launch.ok()) << launch.status();
  EXPECT_EQ(launch->params.vector_chunks, chunks);
  // The path's bound: 64 query vectors (4 chunks of 16) are short, 65 are not.
  const int32_t most = kernels::kVarlenChunkVectors * kernels::kVarlenMaxVectorChunks;
  ASSERT_EQ(most, 64);
  for (VarlenKernel kernel : {VarlenKernel::kShortQueries, VarlenKernel::kAuto}) {
    a.kernel = kernel;
    a.max_q_len = TokenCount(most);
    launch = VarlenAttentionLaunchFor(a, true, nullptr);
    ASSERT_TRUE(launch.ok()) << launch.status();
    EXPECT_EQ(launch->params.vector_chunks, kernels::kVarlenMaxVectorChunks);
    a.max_q_len = TokenCount(most + 1);
    launch = VarlenAttentionLaunchFor(a, true, nullptr);
    if (kernel == VarlenKernel::kShortQueries) {
      EXPECT_EQ(launch.status().code(), absl::StatusCode::kInvalidArgument) << launch.status();
    } else {
      ASSERT_TRUE(launch.ok()) << launch.status();
      EXPECT_EQ(launch->params.vector_chunks, 0);  // the tiled path
    }
  }
}

TEST_F(VarlenAttentionArgsTest, AMaskGivesTheKernelItsLayoutAndWords) {
  VarlenAttentionArgs a = Good();
  a.mask = Full();
  absl::StatusOr<VarlenAttentionLaunch> launch = VarlenAttentionLaunchFor(a, true, nullptr);
  ASSERT_TRUE(launch.ok()) << launch.status();
  EXPECT_EQ(launch->params.mask_layout, kernels::kVarlenMaskFull);
  EXPECT_EQ(launch->params.mask_capacity, 4096);
  a.mask.layout = MaskLayout::kQLenOnly;
  launch = VarlenAttentionLaunchFor(a, true, nullptr);
  ASSERT_TRUE(launch.ok()) << launch.status();
  EXPECT_EQ(launch->params.mask_layout, kernels::kVarlenMaskQLenOnly);
  a.mask.layout = MaskLayout::kBitPacked;
  // 40 rows are past the bit-packed maximum; 30 fit in 4-byte words.
  EXPECT_EQ(VarlenAttentionLaunchFor(a, true, nullptr).status().code(), kInvalid);
  a.q = q_.span<const uint8_t>(0, static_cast<size_t>(60 * kQRow));
  a.out = out_.span<uint8_t>(0, static_cast<size_t>(60 * kQRow));
  a.lse = lse_.span<float>(0, static_cast<size_t>(60 * kQHeads));
  a.max_q_len = TokenCount(30);
  launch = VarlenAttentionLaunchFor(a, true, nullptr);
  ASSERT_TRUE(launch.ok()) << launch.status();
  EXPECT_EQ(launch->params.mask_layout, kernels::kVarlenMaskBitPacked);
  EXPECT_EQ(launch->params.mask_word_bytes, MaskWordBytes(TokenCount(30)));
}

TEST_F(VarlenAttentionArgsTest, NoQueryRowsLaunchNothing) {
  VarlenAttentionArgs a = Good();
  const std::vector<TokenOffset> zero = {TokenOffset(0)};
  a.kv = DecodeTokenLevelKv{HostSpan(zero), {}};
  a.qo_indptr = HostSpan(zero);
  a.q = {};
  a.out = {};
  a.lse = {};
  a.max_q_len = TokenCount(0);
  absl::StatusOr<VarlenAttentionLaunch> launch = VarlenAttentionLaunchFor(a, true, nullptr);
  ASSERT_TRUE(launch.ok()) << launch.status();
  EXPECT_EQ(launch->blocks, 0);
}

// A captured variable-row extend's tail: 13 rows of q past qo_indptr[bs] that no sequence
// claims. The kernel is told to write them only when the arguments say so, and checked mode
// accepts such a tail only for a launch that writes it.
TEST_F(VarlenAttentionArgsTest, UnclaimedRowsAreWrittenOnlyWhenAsked) {
  EXPECT_EQ(VarlenAttentionLaunchFor(Good(), true, nullptr)->params.zero_unclaimed_rows, 0);
  const int64_t rows = rows_ + 13;
  HostBuffer q(rows * kQRow), out(rows * kQRow), lse(rows * kQHeads * 4);
  VarlenAttentionArgs a = Good();
  a.q = q.span<const uint8_t>();
  a.out = out.span<uint8_t>();
  a.lse = lse.span<float>();
  a.zero_unclaimed_rows = true;
  absl::StatusOr<VarlenAttentionLaunch> launch = VarlenAttentionLaunchFor(a, true, nullptr);
  ASSERT_TRUE(launch.ok()) << launch.status();
  EXPECT_EQ(launch->params.zero_unclaimed_rows, 1);
  EXPECT_EQ(launch->params.q_rows, rows);

  ValidationContext ctx{fixture_.pool_slots(), fixture_.page_size(), TokenCount(rows)};
  ctx.allow_unclaimed_rows = true;
  const CheckedMetadata checked{metadata_.view(), ctx};
  a.checked = &checked;
  EXPECT_TRUE(VarlenAttentionLaunchFor(a, true, nullptr).ok())
      << VarlenAttentionLaunchFor(a, true, nullptr).status();
  a.zero_unclaimed_rows = false;
  const absl::Status unwritten = VarlenAttentionLaunchFor(a, true, nullptr).status();
  EXPECT_EQ(unwritten.code(), kInvalid);
  EXPECT_EQ(unwritten.message(), absl::StrCat("checked mode: qo_indptr: qo_indptr[bs] = ", rows_,
                                              " but the query tensor has ", rows, " rows"));
  // A context without the allowance refuses the tail as the validator's qo_indptr error.
  ValidationContext strict = ctx;
  strict.allow_unclaimed_rows = false;
  const CheckedMetadata checked_strict{metadata_.view(), strict};
  a.checked = &checked_strict;
  a.zero_unclaimed_rows = true;
  const absl::Status tail = VarlenAttentionLaunchFor(a, true, nullptr).status();
  EXPECT_EQ(tail.code(), kInvalid);
  EXPECT_EQ(tail.message(), absl::StrCat("checked mode: qo_indptr: qo_indptr[bs] = ", rows_,
                                         " but the query tensor has ", rows, " rows"));
}

// What the host can see is refused, with the code the contract gives and a message naming it.
TEST_F(VarlenAttentionArgsTest, BadArgumentsAreRefused) {
  const int64_t rows = rows_, q_bytes = rows_ * kQRow, pool_bytes = pool_bytes_;
  // Checked mode: the host copy of the metadata, one that fails validation although every
  // slot is inside the pool, and the context of another launch.
  ValidationContext ctx{fixture_.pool_slots(), fixture_.page_size(), TokenCount(rows)};
  ctx.check_slot_ownership = true;
  const CheckedMetadata checked{metadata_.view(), ctx};
  // Sequence 0's last new token in a slot of sequence 1; without the page table, which would
  // disagree first (the launch reads kv_indices).
  ForwardMetadata twice = metadata_;
  twice.kv_indices[twice.kv_indptr[1].value() - 1] = twice.kv_indices[twice.kv_indptr[1].value()];
  twice.page_table = PageTable();
  const CheckedMetadata checked_twice{twice.view(), ctx};
  ValidationContext fewer_rows = ctx;
  fewer_rows.num_query_rows = TokenCount(rows - 1);
  const CheckedMetadata checked_other{metadata_.view(), fewer_rows};
  const PageCount cols(metadata_.page_table.cols());
  const size_t kv_entries = metadata_.kv_indices.size();

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
      {"checked: the context of another launch's query rows",
       [&](VarlenAttentionArgs& a) { a.checked = &checked_other; }, kInvalid,
       "checked mode: the context's num_query_rows is "},
      {"checked: a mask the host metadata does not have",
       [&](VarlenAttentionArgs& a) {
         a.mask = Full();
         a.checked = &checked;
       },
       kInvalid, "checked mode: the host metadata's mask layout is none, the launch's full"},
      {"heads that do not divide", [](VarlenAttentionArgs& a) { a.dims.num_kv_heads = 5; },
       kInvalid, "num_q_heads 32 is not a positive multiple of num_kv_heads 5"},
      {"no query heads", [](VarlenAttentionArgs& a) { a.dims.num_q_heads = 0; }, kInvalid,
       "num_q_heads 0 is not a positive multiple"},
      {"head dim 96", [](VarlenAttentionArgs& a) { a.dims.head_dim = 96; }, kInvalid,
       "head_dim 96 is not 64, 128 or 256"},
      {"head dim 512", [](VarlenAttentionArgs& a) { a.dims.head_dim = 512; }, kInvalid,
       "head_dim 512 is not 64, 128 or 256"},
      {"unknown element type",
       [](VarlenAttentionArgs& a) { a.dims.dtype = static_cast<KvElementType>(7); }, kInvalid,
       "unknown element type"},
      {"NaN scale", [](VarlenAttentionArgs& a) { a.dims.softmax_scale = std::nanf(""); }, kInvalid,
       "is not finite and > 0"},
      {"zero scale", [](VarlenAttentionArgs& a) { a.dims.softmax_scale = 0; }, kInvalid,
       "softmax_scale 0 is not finite and > 0"},
      {"q misaligned", [&](VarlenAttentionArgs& a) { a.q = q_.span<const uint8_t>(2, q_bytes); },
       kInvalid, "must be 16-byte aligned"},
      {"k_pool misaligned",
       [&](VarlenAttentionArgs& a) { a.k_pool = k_.span<const uint8_t>(8, pool_bytes); }, kInvalid,
       "must be 16-byte aligned"},
      {"v_pool misaligned",
       [&](VarlenAttentionArgs& a) { a.v_pool = v_.span<const uint8_t>(4, pool_bytes); }, kInvalid,
       "must be 16-byte aligned"},
      {"out misaligned", [&](VarlenAttentionArgs& a) { a.out = out_.span<uint8_t>(2, q_bytes); },
       kInvalid, "must be 16-byte aligned"},
      {"null q", [&](VarlenAttentionArgs& a) { a.q = DeviceSpan<const uint8_t>(nullptr, q_bytes); },
       kInvalid, absl::StrCat("q has ", q_bytes, " elements but a null pointer")},
      {"null k_pool",
       [&](VarlenAttentionArgs& a) { a.k_pool = DeviceSpan<const uint8_t>(nullptr, pool_bytes); },
       kInvalid, absl::StrCat("k_pool has ", pool_bytes, " elements but a null pointer")},
      {"null v_pool",
       [&](VarlenAttentionArgs& a) { a.v_pool = DeviceSpan<const uint8_t>(nullptr, pool_bytes); },
       kInvalid, absl::StrCat("v_pool has ", pool_bytes, " elements but a null pointer")},
      {"null out", [&](VarlenAttentionArgs& a) { a.out = DeviceSpan<uint8_t>(nullptr, q_bytes); },
       kInvalid, absl::StrCat("out has ", q_bytes, " elements but a null pointer")},
      {"null lse", [&](VarlenAttentionArgs& a) { a.lse = DeviceSpan<float>(nullptr, rows * 32); },
       kInvalid, absl::StrCat("lse has ", rows * 32, " elements but a null pointer")},
      {"null qo_indptr",
       [&](VarlenAttentionArgs& a) { a.qo_indptr = DeviceSpan<const TokenOffset>(nullptr, 4); },
       kInvalid, "qo_indptr has 4 elements but a null pointer"},
      {"qo_indptr of another batch",
       [&](VarlenAttentionArgs& a) {
         a.qo_indptr = DeviceSpan<const TokenOffset>(metadata_.qo_indptr.data(), 3);
       },
       kInvalid, "qo_indptr has 3 entries, the KV source's batch of 3 wants 4"},
      {"q that is not whole rows",
       [&](VarlenAttentionArgs& a) { a.q = q_.span<const uint8_t>(0, q_bytes - 16); }, kInvalid,
       "are not the same whole rows"},
      {"out of another size",
       [&](VarlenAttentionArgs& a) { a.out = out_.span<uint8_t>(0, q_bytes - kQRow); }, kInvalid,
       "are not the same whole rows"},
      {"lse of another size",
       [&](VarlenAttentionArgs& a) { a.lse = lse_.span<float>(0, rows * 32 + 1); }, kInvalid,
       "are not the same whole rows"},
      {"K and V pools of different sizes",
       [&](VarlenAttentionArgs& a) { a.v_pool = v_.span<const uint8_t>(0, pool_bytes - 2048); },
       kInvalid, absl::StrCat("K/V pools of ", pool_bytes, " and ", pool_bytes - 2048, " bytes")},
      {"pools that are not whole rows",
       [&](VarlenAttentionArgs& a) {
         a.k_pool = k_.span<const uint8_t>(0, pool_bytes - 16);
         a.v_pool = v_.span<const uint8_t>(0, pool_bytes - 16);
       },
       kInvalid, "bytes are not the same whole rows of 2048"},
      {"max_q_len past the query rows",
       [&](VarlenAttentionArgs& a) { a.max_q_len = TokenCount(rows + 1); }, kInvalid,
       "max_q_len 68 does not fit 67 query rows over 3 sequences"},
      {"negative max_q_len", [](VarlenAttentionArgs& a) { a.max_q_len = TokenCount(-1); }, kInvalid,
       "max_q_len -1 does not fit"},
      {"max_q_len too small for the rows",
       [](VarlenAttentionArgs& a) { a.max_q_len = TokenCount(10); }, kInvalid,
       "max_q_len 10 does not fit 67 query rows"},
      {"max_q_len 0 with rows", [](VarlenAttentionArgs& a) { a.max_q_len = TokenCount(0); },
       kInvalid, "max_q_len 0 does not fit"},
      {"mask layout without mask_indptr",
       [&](VarlenAttentionArgs& a) {
         a.mask = VarlenMask{MaskLayout::kFull, mask_.span<const uint8_t>(), {}};
       },
       kInvalid, "a full mask needs mask_indptr of bs + 1 = 4 entries, got 0"},
      {"mask_indptr of another batch",
       [&](VarlenAttentionArgs& a) {
         a.mask = VarlenMask{MaskLayout::kQLenOnly, mask_.span<const uint8_t>(),
                             mask_indptr_.span<const int64_t>(0, 5)};
       },
       kInvalid, "a qlen_only mask needs mask_indptr of bs + 1 = 4 entries, got 5"},
      {"mask arrays without a layout",
       [&](VarlenAttentionArgs& a) {
         a.mask = VarlenMask{MaskLayout::kNone, mask_.span<const uint8_t>(), {}};
       },
       kInvalid, "mask arrays (4096 bytes, 0 mask_indptr entries) without a mask layout"},
      {"mask_indptr without a layout",
       [&](VarlenAttentionArgs& a) {
         a.mask = VarlenMask{MaskLayout::kNone, {}, mask_indptr_.span<const int64_t>(0, 4)};
       },
       kInvalid, "mask arrays (0 bytes, 4 mask_indptr entries) without a mask layout"},
      {"unknown mask layout",
       [&](VarlenAttentionArgs& a) {
         a.mask = Full();
         a.mask.layout = static_cast<MaskLayout>(9);
       },
       kInvalid, "unknown mask layout"},
      {"bit-packed mask past 32 rows",
       [&](VarlenAttentionArgs& a) {
         a.mask = Full();
         a.mask.layout = MaskLayout::kBitPacked;
       },
       kInvalid, "a bit-packed mask holds at most 32 query rows, max_q_len is 40"},
      {"mask_indptr misaligned",
       [&](VarlenAttentionArgs& a) {
         a.mask = Full();
         a.mask.mask_indptr = mask_indptr_.span<const int64_t>(4, 4);
       },
       kInvalid, "mask_indptr must be 8-byte aligned"},
      {"null mask",
       [&](VarlenAttentionArgs& a) {
         a.mask = Full();
         a.mask.mask = DeviceSpan<const uint8_t>(nullptr, 4096);
       },
       kInvalid, "mask has 4096 elements but a null pointer"},
      {"null mask_indptr",
       [&](VarlenAttentionArgs& a) {
         a.mask = Full();
         a.mask.mask_indptr = DeviceSpan<const int64_t>(nullptr, 4);
       },
       kInvalid, "mask_indptr has 4 elements but a null pointer"},
      {"null kv_indices",
       [&](VarlenAttentionArgs& a) {
         a.kv = DecodeTokenLevelKv{HostSpan(metadata_.kv_indptr),
                                   DeviceSpan<const TokenSlot>(nullptr, kv_entries)};
       },
       kInvalid, absl::StrCat("kv_indices has ", kv_entries, " elements but a null pointer")},
      {"no kv_indptr",
       [&](VarlenAttentionArgs& a) {
         a.kv = DecodeTokenLevelKv{{}, HostSpan(metadata_.kv_indices)};
       },
       kInvalid, "kv_indptr needs bs + 1 >= 1 entries"},
      {"a batch beyond int32",
       [&](VarlenAttentionArgs& a) {
         a.kv = DecodeTokenLevelKv{
             DeviceSpan<const TokenOffset>(metadata_.kv_indptr.data(), (size_t{1} << 31) + 2),
             HostSpan(metadata_.kv_indices)};
       },
       absl::StatusCode::kOutOfRange, "varlen attention: batch beyond int32"},
      {"page table smaller than the batch",
       [&](VarlenAttentionArgs& a) {
         a.kv = DecodePageTableKv{
             DeviceSpan<const PageId>(page_table_.data(), page_table_.size() - 1), cols,
             HostSpan(metadata_.kv_lens), fixture_.page_size()};
       },
       kInvalid, absl::StrCat("page_table of ", page_table_.size() - 1, " entries is not [3][")},
      {"page table beyond int32 tokens",
       [&](VarlenAttentionArgs& a) {
         a.kv = DecodePageTableKv{HostSpan(page_table_), PageCount(int64_t{1} << 27),
                                  HostSpan(metadata_.kv_lens), fixture_.page_size()};
       },
       absl::StatusCode::kOutOfRange, "covers more than 1073741824 tokens"},
      {"page table of negative columns",
       [&](VarlenAttentionArgs& a) {
         a.kv = DecodePageTableKv{HostSpan(page_table_), PageCount(-1), HostSpan(metadata_.kv_lens),
                                  fixture_.page_size()};
       },
       kInvalid, "a page table of -1 columns (negative)"},
      {"query rows beyond int32",
       [&](VarlenAttentionArgs& a) {
         const int64_t huge = (int64_t{1} << 31) * kQRow;
         a.q = q_.span<const uint8_t>(0, huge);
         a.out = out_.span<uint8_t>(0, huge);
         a.lse = lse_.span<float>(0, (size_t{1} << 31) * 32);
       },
       absl::StatusCode::kOutOfRange, "2147483648 query rows, beyond int32"},
      {"pools whose claimed size passes INT64_MAX",
       [&](VarlenAttentionArgs& a) {
         // A whole number of rows, negative as an int64 (-2048): once it passed as -1 slots,
         // which the kernel's unsigned slot check reads as no bound.
         a.k_pool = k_.span<const uint8_t>(0, SIZE_MAX - 2047);
         a.v_pool = v_.span<const uint8_t>(0, SIZE_MAX - 2047);
       },
       absl::StatusCode::kOutOfRange, "more than 2^31 pool slots"},
      {"a pool slot past 2^31 bytes",
       [&](VarlenAttentionArgs& a) {
         a.dims.num_q_heads = a.dims.num_kv_heads = int32_t{1} << 22;
         a.dims.head_dim = 256;
         a.q = q_.span<const uint8_t>(0, 0);
         a.out = out_.span<uint8_t>(0, 0);
         a.lse = lse_.span<float>(0, 0);
       },
       absl::StatusCode::kOutOfRange, "a pool slot of 2147483648 bytes"},
      {"grid whose block count overflows int64",
       [&](VarlenAttentionArgs& a) {
         // bs 2^30 x 2^27 tiles of 8 rows x 2^17 chunks of 8 heads: 2^74 blocks, 0 modulo 2^64.
         const int64_t bs_claimed = int64_t{1} << 30, heads = int64_t{1} << 20,
                       q_rows = int64_t{1} << 30;
         a.dims.num_q_heads = static_cast<int32_t>(heads);
         a.dims.num_kv_heads = 1;
         a.kv = DecodeTokenLevelKv{
             DeviceSpan<const TokenOffset>(metadata_.kv_indptr.data(), bs_claimed + 1),
             HostSpan(metadata_.kv_indices)};
         a.qo_indptr = DeviceSpan<const TokenOffset>(metadata_.qo_indptr.data(), bs_claimed + 1);
         a.q = q_.span<const uint8_t>(0, q_rows * heads * 128 * 2);
         a.out = out_.span<uint8_t>(0, q_rows * heads * 128 * 2);
         a.lse = lse_.span<float>(0, q_rows * heads);
         a.max_q_len = TokenCount(q_rows);
         a.kernel = VarlenKernel::kTiledCudaCores;
       },
       absl::StatusCode::kOutOfRange, "is more than 16777216 blocks"},
      {"the short-query path for long query rows",
       [&](VarlenAttentionArgs& a) { a.kernel = VarlenKernel::kShortQueries; }, kInvalid,
       "the short-query path takes at most 64 query vectors"},
      {"grid past the block limit",
       [&](VarlenAttentionArgs& a) {
         const int64_t many = int64_t{1} << 25;  // rows: 2^25 / 16 tiles x 3 x 8 blocks
         a.q = q_.span<const uint8_t>(0, many * kQRow);
         a.out = out_.span<uint8_t>(0, many * kQRow);
         a.lse = lse_.span<float>(0, many * 32);
         a.max_q_len = TokenCount(many);
         a.kernel = VarlenKernel::kTiledCudaCores;
       },
       absl::StatusCode::kOutOfRange, "is more than 16777216 blocks"},
      {"grid past the block limit of 256-thread blocks",
       [&](VarlenAttentionArgs& a) {
         // 2^24 rows in tiles of 32 x 3 sequences x 8 head chunks = 1.5 * 2^23 blocks: over
         // the tensor-core kernel's limit of 2^23 (its 256-thread blocks: 2^32 threads on AMD),
         // under the 2^24 of the 128-thread kernels.
         const int64_t many = int64_t{1} << 24;
         a.q = q_.span<const uint8_t>(0, many * kQRow);
         a.out = out_.span<uint8_t>(0, many * kQRow);
         a.lse = lse_.span<float>(0, many * 32);
         a.max_q_len = TokenCount(many);
         a.kernel = VarlenKernel::kTiledTensorCores;
       },
       absl::StatusCode::kOutOfRange, "is more than 8388608 blocks"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    VarlenAttentionArgs a = Good();
    c.edit(a);
    const absl::Status s = VarlenAttentionLaunchFor(a, true, nullptr).status();
    EXPECT_EQ(s.code(), c.code) << s;
    EXPECT_NE(s.message().find(c.words), absl::string_view::npos)
        << s << " does not say \"" << c.words << "\"";
  }
  // The unedited arguments pass, also checked, and through the page table.
  VarlenAttentionArgs a = Good();
  a.checked = &checked;
  EXPECT_TRUE(VarlenAttentionLaunchFor(a, true, nullptr).ok());
  a.kv = PageLevel();
  EXPECT_TRUE(VarlenAttentionLaunchFor(a, false, nullptr).ok());
}

}  // namespace
}  // namespace attnmeta
