#include "attention/graph/captured_write.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace attnmeta {
namespace {

// Backing storage for every buffer (the comparison reads only addresses and sizes).
struct Storage {
  std::vector<ReqPoolIndex> rows = std::vector<ReqPoolIndex>(8, ReqPoolIndex(0));
  std::vector<TokenLength> lens = std::vector<TokenLength>(24);
  std::vector<uint8_t> bytes = std::vector<uint8_t>(64);
  std::vector<TokenOffset> offsets = std::vector<TokenOffset>(40);
  std::vector<TokenSlot> slots = std::vector<TokenSlot>(256);
  std::vector<PageId> pages = std::vector<PageId>(32);
  std::vector<SplitKvWorkItem> work = std::vector<SplitKvWorkItem>(16);
  std::vector<int32_t> units = std::vector<int32_t>(8);
  std::vector<SplitKvReduceItem> reduce = std::vector<SplitKvReduceItem>(8);
  std::vector<int64_t> mask_indptr = std::vector<int64_t>(9);
};

GraphBuffers BuffersOver(Storage& s) {
  GraphBuffers b;
  b.req_rows = absl::MakeSpan(s.rows);
  b.kv_lens = absl::MakeSpan(s.lens).subspan(0, 8);
  b.q_lens = absl::MakeSpan(s.lens).subspan(8, 8);
  b.tree_mask = absl::MakeSpan(s.bytes).subspan(0, 32);
  b.kv_indptr = absl::MakeSpan(s.offsets).subspan(0, 9);
  b.qo_indptr = absl::MakeSpan(s.offsets).subspan(9, 9);
  b.kv_last_page_len = absl::MakeSpan(s.lens).subspan(16, 8);
  b.kv_indices = absl::MakeSpan(s.slots).subspan(0, 128);
  b.page_table = *PageTableSpan<PageId>::Create(absl::MakeSpan(s.pages), 8, PageCount(4));
  b.split_kv = {absl::MakeSpan(s.work), absl::MakeSpan(s.units), absl::MakeSpan(s.reduce)};
  b.mask_indptr = absl::MakeSpan(s.mask_indptr);
  b.custom_mask = absl::MakeSpan(s.bytes).subspan(32, 32);
  b.draft_qo_indptr = absl::MakeSpan(s.offsets).subspan(18, 9);
  b.draft_steps.push_back(
      {absl::MakeSpan(s.offsets).subspan(27, 9), absl::MakeSpan(s.lens).subspan(0, 8),
       absl::MakeSpan(s.lens).subspan(8, 8), absl::MakeSpan(s.slots).subspan(128, 64)});
  return b;
}

MetadataWriteRequest Request() {
  MetadataWriteRequest r;
  r.mode = ForwardMode::kTargetVerify;
  r.real_batch_size = 5;
  r.padded_batch_size = 8;
  r.padded_kv_len = TokenLength(1);
  r.page_size = *PageSize::Create(16);
  r.page_table = true;
  r.split_kv = true;
  r.split_kv_options.layout = KvLayout::Paged(*PageSize::Create(16));
  r.split_kv_options.num_units = 7;
  r.split_kv_options.kv_granularity = TokenCount(32);
  r.split_kv_options.q_tile = TokenCount(4);
  r.mask_layout = MaskLayout::kFull;
  r.draft_decode = {2, 3};
  r.q_len_per_request = TokenLength(4);
  r.generation = 3;
  return r;
}

TEST(CapturedWriteTest, TheSameWriteDiffersInNothing) {
  Storage s;
  const CapturedWrite w = CapturedWriteOf(Request(), BuffersOver(s));
  EXPECT_EQ(FirstDifference(w, Request(), BuffersOver(s)), "");
}

TEST(CapturedWriteTest, NamesEachLaunchParameterThatChanged) {
  Storage s;
  const GraphBuffers b = BuffersOver(s);
  const CapturedWrite recorded = CapturedWriteOf(Request(), b);
  const std::vector<std::pair<std::string, std::function<void(MetadataWriteRequest&)>>> cases = {
      {"page_size", [](MetadataWriteRequest& r) { r.page_size = *PageSize::Create(64); }},
      {"page_table", [](MetadataWriteRequest& r) { r.page_table = false; }},
      {"split_kv", [](MetadataWriteRequest& r) { r.split_kv = false; }},
      {"split_kv_options.layout",
       [](MetadataWriteRequest& r) { r.split_kv_options.layout = KvLayout::LinearPerToken(); }},
      {"split_kv_options.num_units",
       [](MetadataWriteRequest& r) { r.split_kv_options.num_units = 8; }},
      {"split_kv_options.kv_granularity",
       [](MetadataWriteRequest& r) { r.split_kv_options.kv_granularity = TokenCount(64); }},
      {"split_kv_options.q_tile",
       [](MetadataWriteRequest& r) { r.split_kv_options.q_tile = TokenCount(8); }},
      {"mask_layout", [](MetadataWriteRequest& r) { r.mask_layout = MaskLayout::kNone; }},
      {"draft_decode.topk", [](MetadataWriteRequest& r) { r.draft_decode.topk = 1; }},
      {"draft_decode.steps", [](MetadataWriteRequest& r) { r.draft_decode.steps = 4; }},
      {"q_len_per_request", [](MetadataWriteRequest& r) { r.q_len_per_request = TokenLength(5); }},
  };
  for (const auto& [name, change] : cases) {
    MetadataWriteRequest r = Request();
    change(r);
    EXPECT_EQ(FirstDifference(recorded, r, b), name);
  }
}

TEST(CapturedWriteTest, IgnoresWhatTheStagedInputsAndTheKeyCarry) {
  Storage s;
  const GraphBuffers b = BuffersOver(s);
  const CapturedWrite recorded = CapturedWriteOf(Request(), b);
  const std::vector<TokenLength> host(8, TokenLength(3));
  MetadataWriteRequest r = Request();
  r.real_batch_size = 2;
  r.padded_kv_len = TokenLength(2);
  r.host_kv_lens = host;
  r.host_q_lens = host;
  r.generation = 4;
  r.padded_batch_size = 4;
  r.mode = ForwardMode::kDecode;
  EXPECT_EQ(FirstDifference(recorded, r, b), "");
}

// Extend captures one bucket at several query lengths, which only bound a mask's bytes.
TEST(CapturedWriteTest, QueryRowsCountOnlyWithAMask) {
  Storage s;
  const GraphBuffers b = BuffersOver(s);
  MetadataWriteRequest extend = Request();
  extend.mode = ForwardMode::kExtend;
  extend.mask_layout = MaskLayout::kNone;
  const CapturedWrite recorded = CapturedWriteOf(extend, b);
  extend.q_len_per_request = TokenLength(2);
  EXPECT_EQ(FirstDifference(recorded, extend, b), "");
  MetadataWriteRequest verify = Request();
  const CapturedWrite with_mask = CapturedWriteOf(verify, b);
  verify.q_len_per_request = TokenLength(2);
  EXPECT_EQ(FirstDifference(with_mask, verify, b), "q_len_per_request");
}

TEST(CapturedWriteTest, NamesEachBufferThatMovedOrChangedSize) {
  Storage s, elsewhere;
  const GraphBuffers b = BuffersOver(s);
  const GraphBuffers o = BuffersOver(elsewhere);
  const CapturedWrite recorded = CapturedWriteOf(Request(), b);
  const std::vector<std::pair<std::string, std::function<void(GraphBuffers&)>>> cases = {
      {"buffer req_rows", [&](GraphBuffers& x) { x.req_rows = o.req_rows; }},
      {"buffer kv_lens", [&](GraphBuffers& x) { x.kv_lens = x.kv_lens.subspan(0, 7); }},
      {"buffer q_lens", [&](GraphBuffers& x) { x.q_lens = o.q_lens; }},
      {"buffer tree_mask", [&](GraphBuffers& x) { x.tree_mask = o.tree_mask; }},
      {"buffer kv_indptr", [&](GraphBuffers& x) { x.kv_indptr = o.kv_indptr; }},
      {"buffer qo_indptr", [&](GraphBuffers& x) { x.qo_indptr = o.qo_indptr; }},
      {"buffer kv_last_page_len",
       [&](GraphBuffers& x) { x.kv_last_page_len = o.kv_last_page_len; }},
      {"buffer kv_indices", [&](GraphBuffers& x) { x.kv_indices = x.kv_indices.subspan(1); }},
      {"buffer page_table", [&](GraphBuffers& x) { x.page_table = o.page_table; }},
      {"buffer page_table",
       [&](GraphBuffers& x) {
         x.page_table = *PageTableSpan<PageId>::Create(absl::MakeSpan(s.pages), 4, PageCount(8));
       }},
      {"buffer split_kv.work", [&](GraphBuffers& x) { x.split_kv.work = o.split_kv.work; }},
      {"buffer split_kv.unit_indptr",
       [&](GraphBuffers& x) { x.split_kv.unit_indptr = o.split_kv.unit_indptr; }},
      {"buffer split_kv.reduce", [&](GraphBuffers& x) { x.split_kv.reduce = o.split_kv.reduce; }},
      {"buffer mask_indptr", [&](GraphBuffers& x) { x.mask_indptr = o.mask_indptr; }},
      {"buffer custom_mask", [&](GraphBuffers& x) { x.custom_mask = o.custom_mask; }},
      {"buffer draft_qo_indptr", [&](GraphBuffers& x) { x.draft_qo_indptr = o.draft_qo_indptr; }},
      {"buffer draft_steps", [&](GraphBuffers& x) { x.draft_steps.clear(); }},
      {"buffer draft_steps",
       [&](GraphBuffers& x) { x.draft_steps[0].kv_indptr = o.draft_steps[0].kv_indptr; }},
      {"buffer draft_steps",
       [&](GraphBuffers& x) { x.draft_steps[0].kv_lens = o.draft_steps[0].kv_lens; }},
      {"buffer draft_steps",
       [&](GraphBuffers& x) {
         x.draft_steps[0].kv_last_page_len = o.draft_steps[0].kv_last_page_len;
       }},
      {"buffer draft_steps",
       [&](GraphBuffers& x) { x.draft_steps[0].kv_indices = o.draft_steps[0].kv_indices; }},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    GraphBuffers now = b;
    cases[i].second(now);
    EXPECT_EQ(FirstDifference(recorded, Request(), now), cases[i].first) << "case " << i;
  }
}

}  // namespace
}  // namespace attnmeta
