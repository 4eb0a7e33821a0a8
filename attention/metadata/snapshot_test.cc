#include "attention/metadata/snapshot.h"

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
                      const std::function<void(MetadataSnapshot&)>& corrupt) {
    MetadataSnapshot s = good_;
    corrupt(s);
    const absl::Status st = CheckSnapshot(s);
    EXPECT_FALSE(st.ok()) << array;
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
  // Broken inputs are named too.
  ExpectRejected("mode", [](MetadataSnapshot& s) { s.set_mode("prefill"); });
  ExpectRejected("page_size", [](MetadataSnapshot& s) { s.set_page_size(0); });
  ExpectRejected("req_rows", [](MetadataSnapshot& s) { s.mutable_req_rows()->Set(0, 63); });
  ExpectRejected("req_to_token", [](MetadataSnapshot& s) { *s.add_req_to_token() = s.req_to_token(0); });
  ExpectRejected("req_to_token", [](MetadataSnapshot& s) { s.set_max_context_len(int64_t{1} << 40); });
  ExpectRejected("req_to_token row", [](MetadataSnapshot& s) { s.set_max_context_len(10); });
  ExpectRejected("rebuilding", [](MetadataSnapshot& s) { s.set_mode("decode"); });
}

}  // namespace
}  // namespace attnmeta
