#include "attention/metadata/snapshot.h"

#include <algorithm>
#include <functional>
#include <string>

#include "attention/metadata/builders.h"
#include "attention/metadata/testing/batch_fixture.h"
#include "gtest/gtest.h"

namespace attnmeta {
namespace {

using testing::BatchFixture;

class SnapshotTest : public ::testing::Test {
 protected:
  void SetUp() override {
    f_.AddSequence(37, 5);
    f_.AddSequence(0, 20);
    f_.AddSequenceSharingPrefix(0, 16, 19, 2);
    auto m = BuildForwardMetadata(f_.Batch(ForwardMode::kExtend), f_.pool(), f_.page_size());
    ASSERT_TRUE(m.ok()) << m.status();
    auto snapshot = MakeSnapshot(f_.Batch(ForwardMode::kExtend), f_.pool(), f_.page_size(),
                                 f_.pool_slots(), *m);
    ASSERT_TRUE(snapshot.ok()) << snapshot.status();
    good_ = *std::move(snapshot);
  }

  // Corrupts a copy of the snapshot; CheckSnapshot must fail naming `array`.
  void ExpectRejected(const std::string& array,
                      const std::function<void(MetadataSnapshot&)>& corrupt,
                      absl::StatusCode code = absl::StatusCode::kInvalidArgument) {
    MetadataSnapshot s = good_;
    corrupt(s);
    const absl::Status st = CheckSnapshot(s);
    EXPECT_EQ(st.code(), code) << array << ": " << st;
    EXPECT_EQ(std::string(st.message()).rfind(array, 0), 0u)
        << "message should start with " << array << ": " << st.message();
  }

  BatchFixture f_{7, 3};
  MetadataSnapshot good_;
};

TEST_F(SnapshotTest, TextRoundTripChecksOk) {
  auto back = SnapshotFromText(SnapshotToText(good_));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(CheckSnapshot(*back).ok()) << CheckSnapshot(*back);
  EXPECT_EQ(SnapshotToText(*back), SnapshotToText(good_));
  EXPECT_EQ(SnapshotFromText("kv_indptr: banana").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(SnapshotTest, EveryCorruptedArrayIsNamed) {
  // Breaks an invariant: the validator names the array.
  ExpectRejected("kv_indptr", [](MetadataSnapshot& s) { s.set_kv_indptr(1, 3); });
  ExpectRejected("qo_indptr", [](MetadataSnapshot& s) { s.mutable_qo_indptr()->RemoveLast(); });
  ExpectRejected("kv_indices", [](MetadataSnapshot& s) { s.set_kv_indices(4, 1 << 30); });
  ExpectRejected("kv_last_page_len", [](MetadataSnapshot& s) { 
    s.set_kv_last_page_len(0, s.kv_last_page_len(0) % 7 + 1);
  });
  ExpectRejected("max_kv_len", [](MetadataSnapshot& s) { s.set_max_kv_len(s.max_kv_len() + 1); });
  ExpectRejected("max_q_len", [](MetadataSnapshot& s) { s.set_max_q_len(1); });
  ExpectRejected("page_table", [](MetadataSnapshot& s) { s.set_page_table(0, s.page_table(1)); });
  ExpectRejected("page_table", [](MetadataSnapshot& s) { s.set_page_table_cols(1); });
  // Valid on its own but not what the inputs give: the comparison names the array.
  ExpectRejected("kv_indices", [](MetadataSnapshot& s) {
    // Swap two whole pages' worth of slots of sequence 1: still page-consistent.
    const int32_t a = s.kv_indptr(1), b = s.kv_indptr(1) + 7;
    for (int t = 0; t < 7; ++t) {
      const int32_t x = s.kv_indices(a + t);
      s.set_kv_indices(a + t, s.kv_indices(b + t));
      s.set_kv_indices(b + t, x);
    }
    // Row 1, columns 0 and 1 of the page table follow.
    std::swap(*s.mutable_page_table()->Mutable(s.page_table_cols() + 0),
              *s.mutable_page_table()->Mutable(s.page_table_cols() + 1));
  });
  // A recorded kv_indices longer than the batch's is valid as a buffer, but not what the
  // inputs give.
  ExpectRejected("kv_indices: recorded", [](MetadataSnapshot& s) { s.add_kv_indices(17); });
  // Broken inputs are named too.
  ExpectRejected("mode", [](MetadataSnapshot& s) { s.set_mode("prefill"); });
  ExpectRejected("page_size", [](MetadataSnapshot& s) { s.set_page_size(0); });
  ExpectRejected("req_rows", [](MetadataSnapshot& s) { s.mutable_req_rows()->Set(0, 63); });
  ExpectRejected("req_to_token", [](MetadataSnapshot& s) { *s.add_req_to_token() = s.req_to_token(0); });
  ExpectRejected("req_to_token", [](MetadataSnapshot& s) { s.set_max_context_len(int64_t{1} << 40); });
  ExpectRejected("req_to_token", [](MetadataSnapshot& s) { s.set_max_reqs(0); });
  ExpectRejected(
      "req_to_token row", [](MetadataSnapshot& s) { s.set_max_context_len(10); },
      absl::StatusCode::kOutOfRange);
  ExpectRejected("rebuilding", [](MetadataSnapshot& s) { s.set_mode("decode"); });
  // One page-table entry more than its [rows][cols] (the view would take a prefix of it).
  ExpectRejected("page_table", [](MetadataSnapshot& s) { s.add_page_table(0); });
}

// A recorded row may fill its whole max_context_len; one slot more is OutOfRange.
TEST_F(SnapshotTest, ARowFillingMaxContextLenIsTaken) {
  int64_t longest = 0;
  for (const ReqToTokenRow& r : good_.req_to_token()) {
    longest = std::max<int64_t>(longest, r.slots_size());
  }
  ASSERT_GT(longest, 1);
  MetadataSnapshot s = good_;
  s.set_max_context_len(longest);
  EXPECT_TRUE(CheckSnapshot(s).ok()) << CheckSnapshot(s);
  s.set_max_context_len(longest - 1);
  EXPECT_EQ(CheckSnapshot(s).code(), absl::StatusCode::kOutOfRange) << CheckSnapshot(s);
}

// Inputs that would make the check read out of bounds or allocate without bound are refused
// before anything is rebuilt.
TEST_F(SnapshotTest, CorruptInputsAreRefusedBeforeRebuilding) {
  auto expect = [&](absl::StatusCode code, const std::string& prefix,
                    const std::function<void(MetadataSnapshot&)>& corrupt) {
    MetadataSnapshot s = good_;
    corrupt(s);
    const absl::Status st = CheckSnapshot(s);
    EXPECT_EQ(st.code(), code) << prefix << ": " << st;
    EXPECT_EQ(std::string(st.message()).rfind(prefix, 0), 0u) << st.message();
    EXPECT_EQ(RewriteSnapshot(s).status().code(), code) << prefix;
  };
  // Rows outside [0, max_reqs), in the recorded table or in the batch.
  expect(absl::StatusCode::kOutOfRange, "req_to_token[0] = row -1",
         [](MetadataSnapshot& s) { s.mutable_req_to_token(0)->set_row(-1); });
  expect(absl::StatusCode::kOutOfRange, "req_to_token[1] = row 64",
         [](MetadataSnapshot& s) { s.mutable_req_to_token(1)->set_row(64); });
  expect(absl::StatusCode::kOutOfRange, "req_rows[0] = row -1",
         [](MetadataSnapshot& s) { s.set_req_rows(0, -1); });
  expect(absl::StatusCode::kOutOfRange, "req_rows[2] = row 64",
         [](MetadataSnapshot& s) { s.set_req_rows(2, 64); });
  // Many short rows and one wide one: the table to rebuild would be rows x the widest row
  // (4099 x 2^16 entries, 1 GiB), past what metadata_check rebuilds. Refused by that product.
  expect(absl::StatusCode::kInvalidArgument, "req_to_token: 4099 rows of up to 65536 slots",
         [](MetadataSnapshot& s) {
           s.set_max_reqs(8192);
           s.set_max_context_len(1 << 16);
           for (int r = 1000; r < 1000 + 4096; ++r) {
             ReqToTokenRow& row = *s.add_req_to_token();
             row.set_row(r);
             row.add_slots(r);
           }
           s.mutable_req_to_token(0)->mutable_slots()->Resize(1 << 16, 0);
         });
  // A small file declaring huge lengths: refused against the recorded row, no allocation.
  expect(absl::StatusCode::kInvalidArgument, "kv_lens: request 1",
         [](MetadataSnapshot& s) { s.set_kv_lens(1, 2000000000); });
  expect(absl::StatusCode::kInvalidArgument, "kv_lens: request 0", [](MetadataSnapshot& s) {
    s.set_max_context_len(1 << 24);
    s.set_kv_lens(0, 1 << 23);
  });
  expect(absl::StatusCode::kInvalidArgument, "kv_lens: request 0",
         [](MetadataSnapshot& s) { s.set_kv_lens(0, -1); });
  // Arrays of the wrong size, kv_start_idx among them (it once aborted the process).
  expect(absl::StatusCode::kInvalidArgument, "kv_start_idx: 2 entries for 3 requests",
         [](MetadataSnapshot& s) {
           s.set_page_table_enabled(false);
           s.add_kv_start_idx(0);
           s.add_kv_start_idx(0);
         });
  expect(absl::StatusCode::kInvalidArgument, "q_lens: 2 entries",
         [](MetadataSnapshot& s) { s.mutable_q_lens()->RemoveLast(); });
  expect(absl::StatusCode::kInvalidArgument, "kv_lens: 4 entries",
         [](MetadataSnapshot& s) { s.add_kv_lens(1); });
  expect(absl::StatusCode::kInvalidArgument, "pool_slots",
         [](MetadataSnapshot& s) { s.set_pool_slots(-5); });
}

// Snapshots with start offsets (no page table) and with page-aligned lengths round-trip,
// and their start offsets are part of what is checked.
// A batch whose arrays disagree in size is refused, not read past its end.
TEST_F(SnapshotTest, BatchArraysOfOtherSizesAreRefused) {
  ForwardBatch b = f_.Batch(ForwardMode::kExtend);
  auto m = BuildForwardMetadata(b, f_.pool(), f_.page_size());
  ASSERT_TRUE(m.ok()) << m.status();
  const std::vector<TokenLength> fewer(b.kv_lens.begin(), b.kv_lens.end() - 1);
  const std::vector<TokenPosition> one_start = {TokenPosition(0)};
  ForwardBatch short_lens = b, short_starts = b;
  short_lens.kv_lens = fewer;
  short_starts.kv_start_idx = one_start;
  for (const ForwardBatch& bad : {short_lens, short_starts}) {
    EXPECT_EQ(MakeSnapshot(bad, f_.pool(), f_.page_size(), f_.pool_slots(), *m).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
}

TEST(SnapshotShapesTest, StartOffsetsAndPageAlignedLengths) {
  BatchFixture f(16, 9);
  f.AddSequence(48, 16);  // page-aligned: 64 tokens
  f.AddSequence(20, 12);  // 32 tokens, page-aligned too
  f.AddSequence(5, 3);
  const std::vector<TokenPosition> starts = {TokenPosition(16), TokenPosition(0), TokenPosition(2)};
  const std::vector<TokenLength> kv = {TokenLength(48), TokenLength(32), TokenLength(6)};
  ForwardBatch b = f.Batch(ForwardMode::kExtend);
  b.kv_start_idx = starts;
  b.kv_lens = kv;
  BuildOptions no_table;
  no_table.page_table = false;
  auto m = BuildForwardMetadata(b, f.pool(), f.page_size(), no_table);
  ASSERT_TRUE(m.ok()) << m.status();
  auto snap = MakeSnapshot(b, f.pool(), f.page_size(), f.pool_slots(), *m);
  ASSERT_TRUE(snap.ok()) << snap.status();
  ASSERT_EQ(snap->kv_start_idx_size(), 3);
  auto back = SnapshotFromText(SnapshotToText(*snap));
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(CheckSnapshot(*back).ok()) << CheckSnapshot(*back);
  // The offsets matter: without them the rebuilt kv_indices differ from the recorded ones.
  MetadataSnapshot no_starts = *back;
  no_starts.clear_kv_start_idx();
  const absl::Status st = CheckSnapshot(no_starts);
  EXPECT_EQ(std::string(st.message()).rfind("kv_indices[0]", 0), 0u) << st;

  // Page-aligned lengths with a page table.
  const std::vector<TokenLength> full = {TokenLength(64), TokenLength(32), TokenLength(8)};
  ForwardBatch aligned = f.Batch(ForwardMode::kExtend);
  aligned.kv_lens = full;
  auto ma = BuildForwardMetadata(aligned, f.pool(), f.page_size());
  ASSERT_TRUE(ma.ok()) << ma.status();
  EXPECT_EQ(ma->kv_last_page_len[0], TokenLength(16));
  EXPECT_EQ(ma->page_table.cols(), PageCount(4));
  auto sa = MakeSnapshot(aligned, f.pool(), f.page_size(), f.pool_slots(), *ma);
  ASSERT_TRUE(sa.ok());
  EXPECT_TRUE(CheckSnapshot(*sa).ok()) << CheckSnapshot(*sa);
}

// A batch whose inputs give two requests the same new slots (a page handed out twice) is
// refused even though its recorded arrays agree with them.
TEST_F(SnapshotTest, InputsWithASlotHandedOutTwiceAreRefused) {
  MetadataSnapshot s = good_;
  // Request 2's last (new) token takes request 0's last (new) slot, in the table and in the
  // recorded arrays alike; with no page table nothing else disagrees.
  s.set_page_table_enabled(false);
  s.set_page_table_rows(0);
  s.set_page_table_cols(0);
  s.clear_page_table();
  const ReqToTokenRow& r0 = s.req_to_token(0);
  const int32_t stolen = r0.slots(r0.slots_size() - 1);
  ReqToTokenRow* r2 = s.mutable_req_to_token(2);
  r2->set_slots(r2->slots_size() - 1, stolen);
  s.set_kv_indices(s.kv_indices_size() - 1, stolen);
  const absl::Status st = CheckSnapshot(s);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("handed out twice"), absl::string_view::npos) << st;
  const absl::Status rewritten = RewriteSnapshot(s).status();
  EXPECT_EQ(rewritten.code(), absl::StatusCode::kInvalidArgument) << rewritten;
  EXPECT_NE(rewritten.message().find("handed out twice"), absl::string_view::npos) << rewritten;
}

// --rewrite: a snapshot recorded from a buggy engine (wrong arrays, good inputs) is
// re-recorded from its inputs and then checks OK; bad inputs are not rewritten.
TEST_F(SnapshotTest, RewriteRecordsTheFixedBehaviour) {
  MetadataSnapshot buggy = good_;
  buggy.set_max_kv_len(buggy.page_table_cols() * buggy.page_size());  // field bug row 3
  buggy.set_kv_indices(3, buggy.kv_indices(3) + 1);
  buggy.set_kv_last_page_len(0, 7);
  ASSERT_FALSE(CheckSnapshot(buggy).ok());
  auto fixed = RewriteSnapshot(buggy);
  ASSERT_TRUE(fixed.ok()) << fixed.status();
  EXPECT_TRUE(CheckSnapshot(*fixed).ok()) << CheckSnapshot(*fixed);
  EXPECT_EQ(SnapshotToText(*fixed), SnapshotToText(good_));
  MetadataSnapshot bad_inputs = good_;
  bad_inputs.set_mode("decode");
  EXPECT_EQ(RewriteSnapshot(bad_inputs).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace attnmeta

namespace attnmeta {
namespace {

// A target-verify batch records its tree and mask; a corrupted mask, mask_indptr or tree is
// named, and a text round trip checks.
TEST(SnapshotMaskTest, TargetVerifyRecordsItsTreeAndMask) {
  testing::BatchFixture f(16, 4);
  f.AddSequence(30, 3);
  f.AddSequence(9, 3);
  // Request 0: a root with two children; request 1: a chain.
  std::vector<uint8_t> tree = {1, 0, 0, 1, 1, 0, 1, 0, 1,  //
                               1, 0, 0, 1, 1, 0, 1, 1, 1};
  ForwardBatch batch = f.Batch(ForwardMode::kTargetVerify);
  batch.tree_mask = tree;
  for (MaskLayout layout : {MaskLayout::kFull, MaskLayout::kQLenOnly, MaskLayout::kBitPacked}) {
    SCOPED_TRACE(MaskLayoutName(layout));
    BuildOptions options;
    options.mask_layout = layout;
    auto m = BuildForwardMetadata(batch, f.pool(), f.page_size(), options);
    ASSERT_TRUE(m.ok()) << m.status();
    auto snap = MakeSnapshot(batch, f.pool(), f.page_size(), f.pool_slots(), *m);
    ASSERT_TRUE(snap.ok()) << snap.status();
    auto back = SnapshotFromText(SnapshotToText(*snap));
    ASSERT_TRUE(back.ok());
    EXPECT_TRUE(CheckSnapshot(*back).ok()) << CheckSnapshot(*back);
    EXPECT_EQ(back->mask_layout(), MaskLayoutName(layout));

    MetadataSnapshot flipped = *snap;
    (*flipped.mutable_custom_mask())[1] ^= 1;
    EXPECT_EQ(std::string(CheckSnapshot(flipped).message()).rfind("custom_mask", 0), 0u)
        << CheckSnapshot(flipped);
    MetadataSnapshot moved = *snap;
    moved.set_mask_indptr(1, moved.mask_indptr(1) + 1);
    EXPECT_EQ(std::string(CheckSnapshot(moved).message()).rfind("mask_indptr", 0), 0u)
        << CheckSnapshot(moved);
    MetadataSnapshot other_tree = *snap;
    (*other_tree.mutable_tree_mask())[4] = 0;  // request 0's row 1 no longer sees itself
    EXPECT_EQ(std::string(CheckSnapshot(other_tree).message())
                  .rfind("rebuilding from the recorded inputs: custom mask: row 1 of sequence 0 "
                         "does not see itself",
                         0),
              0u)
        << CheckSnapshot(other_tree);
    MetadataSnapshot bad_layout = *snap;
    bad_layout.set_mask_layout("diagonal");
    EXPECT_EQ(std::string(CheckSnapshot(bad_layout).message()).rfind("mask_layout", 0), 0u)
        << CheckSnapshot(bad_layout);
  }
}

}  // namespace
}  // namespace attnmeta
