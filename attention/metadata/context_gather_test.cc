#include "attention/metadata/context_gather.h"

#include <string>
#include <vector>

#include "attention/metadata/builders.h"
#include "attention/metadata/testing/batch_fixture.h"
#include "glog/logging.h"
#include "gtest/gtest.h"

namespace attnmeta {
namespace {

using testing::BatchFixture;

// Captures WARNING lines for the duration of a test.
class WarningCapture : public google::LogSink {
 public:
  WarningCapture() { google::AddLogSink(this); }
  ~WarningCapture() override { google::RemoveLogSink(this); }
  void send(google::LogSeverity severity, const char*, const char*, int, const struct ::tm*,
            const char* message, size_t message_len) override {
    if (severity == google::GLOG_WARNING) lines.emplace_back(message, message_len);
  }
  std::vector<std::string> lines;
};

std::vector<TokenOffset> Offsets(std::initializer_list<int32_t> v) {
  std::vector<TokenOffset> out;
  for (int32_t x : v) out.push_back(TokenOffset(x));
  return out;
}
std::vector<TokenLength> Lens(std::initializer_list<int32_t> v) {
  std::vector<TokenLength> out;
  for (int32_t x : v) out.push_back(TokenLength(x));
  return out;
}
std::vector<TokenSlot> Slots(std::initializer_list<int32_t> v) {
  std::vector<TokenSlot> out;
  for (int32_t x : v) out.push_back(TokenSlot(x));
  return out;
}

TEST(ContextGatherTest, CopiesTokenLevelSlotsSequenceMajor) {
  for (int64_t ps : {1, 7, 64}) {
    BatchFixture f(ps, 5);
    f.AddSequence(100, 3);
    f.AddSequence(0, 50);
    f.AddSequenceSharingPrefix(0, 64, 70, 1);
    auto m = BuildForwardMetadata(f.Batch(ForwardMode::kExtend), f.pool(), f.page_size());
    ASSERT_TRUE(m.ok());
    ContextGatherInputs in{ForwardMode::kExtend, m->kv_indptr, m->kv_indices, m->kv_lens,
                           f.pool_slots()};
    auto g = GatherContextTokens(in);
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_EQ(g->cu_k, m->kv_indptr);
    EXPECT_EQ(g->tok_idx, m->kv_indices);
  }
}

// The fixed-buffer form writes an extend batch's whole slots (kv_indices, kv_indptr: every
// sequence's whole KV is gathered) and reports the total; a cu_k of any size but batch + 1, or
// a tok_idx shorter than the batch's tokens, is refused with nothing written.
TEST(ContextGatherTest, IntoFixedBuffersWritesTheBatchsSlots) {
  BatchFixture f(16, 9);
  f.AddSequence(40, 3);
  f.AddSequence(0, 17);
  auto m = BuildForwardMetadata(f.Batch(ForwardMode::kExtend), f.pool(), f.page_size());
  ASSERT_TRUE(m.ok()) << m.status();
  const ContextGatherInputs in{ForwardMode::kExtend, m->kv_indptr, m->kv_indices, m->kv_lens,
                               f.pool_slots()};
  const size_t tokens = m->kv_indices.size();
  ASSERT_EQ(tokens, 40u + 3 + 17);
  std::vector<TokenSlot> tok(tokens + 3, TokenSlot(-7));
  std::vector<TokenOffset> cu(m->kv_indptr.size(), TokenOffset(-7));
  TokenCount total(-1);
  ASSERT_TRUE(GatherContextTokens(in, absl::MakeSpan(tok), absl::MakeSpan(cu), &total).ok());
  EXPECT_EQ(total, TokenCount(static_cast<int64_t>(tokens)));
  EXPECT_EQ(cu, m->kv_indptr);
  EXPECT_EQ(std::vector<TokenSlot>(tok.begin(), tok.begin() + tokens), m->kv_indices);
  EXPECT_EQ(std::vector<TokenSlot>(tok.begin() + tokens, tok.end()),
            std::vector<TokenSlot>(3, TokenSlot(-7)));
  std::vector<TokenSlot> exact(tokens);
  EXPECT_TRUE(GatherContextTokens(in, absl::MakeSpan(exact), absl::MakeSpan(cu), nullptr).ok());
  EXPECT_EQ(exact, m->kv_indices);
  const auto refused = [&](size_t tok_size, size_t cu_size) {
    std::vector<TokenSlot> t(tok_size, TokenSlot(-7));
    std::vector<TokenOffset> c(cu_size, TokenOffset(-7));
    const absl::Status s = GatherContextTokens(in, absl::MakeSpan(t), absl::MakeSpan(c), nullptr);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_EQ(t, std::vector<TokenSlot>(tok_size, TokenSlot(-7)));
    EXPECT_EQ(c, std::vector<TokenOffset>(cu_size, TokenOffset(-7)));
  };
  refused(tokens, cu.size() - 1);
  refused(tokens, cu.size() + 1);
  refused(tokens - 1, cu.size());
}

TEST(ContextGatherTest, LengthsAreClampedToWhatTheIndptrProvides) {
  const std::vector<TokenSlot> idx = Slots({10, 11, 12, 13, 14, 15});
  // Sequence 0 asks for 5 tokens but the indptr gives 2; sequence 1 asks for 1 of its 4.
  const std::vector<TokenOffset> indptr = Offsets({0, 2, 6});
  const std::vector<TokenLength> lens = Lens({5, 1});
  ContextGatherInputs in{ForwardMode::kExtend, indptr, idx, lens, TokenCount(100)};
  auto g = GatherContextTokens(in);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->tok_idx, Slots({10, 11, 12}));
  EXPECT_EQ(g->cu_k, Offsets({0, 2, 3}));
}

TEST(ContextGatherTest, IndexOutsideTableFallsBackWithWarning) {
  WarningCapture warnings;
  const std::vector<TokenSlot> idx = Slots({10, 11, 12, 13});
  const std::vector<TokenOffset> indptr = Offsets({0, 2, 7});
  const std::vector<TokenLength> lens = Lens({2, 5});
  ContextGatherInputs in{ForwardMode::kMixed, indptr, idx, lens, TokenCount(100)};
  std::vector<TokenSlot> tok(16, TokenSlot(-1));
  std::vector<TokenOffset> cu(3, TokenOffset(-1));
  const absl::Status s = GatherContextTokens(in, absl::MakeSpan(tok), absl::MakeSpan(cu), nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(tok, std::vector<TokenSlot>(16, TokenSlot(-1))) << "nothing written on error";
  EXPECT_EQ(cu, std::vector<TokenOffset>(3, TokenOffset(-1)));
  ASSERT_EQ(warnings.lines.size(), 1u);
  const std::string& w = warnings.lines[0];
  EXPECT_NE(w.find("mode=mixed"), std::string::npos) << w;
  EXPECT_NE(w.find("bs=2"), std::string::npos) << w;
  EXPECT_NE(w.find("index 6"), std::string::npos) << w;
  EXPECT_NE(w.find("length 4"), std::string::npos) << w;
}

TEST(ContextGatherTest, SlotOutsidePoolFallsBackWithWarning) {
  WarningCapture warnings;
  const std::vector<TokenSlot> idx = Slots({10, 11, 5000, 13});
  const std::vector<TokenOffset> indptr = Offsets({0, 4});
  const std::vector<TokenLength> lens = Lens({4});
  ContextGatherInputs in{ForwardMode::kExtend, indptr, idx, lens, TokenCount(4096)};
  EXPECT_EQ(GatherContextTokens(in).status().code(), absl::StatusCode::kOutOfRange);
  ASSERT_EQ(warnings.lines.size(), 1u);
  EXPECT_NE(warnings.lines[0].find("slot 5000"), std::string::npos) << warnings.lines[0];
  EXPECT_NE(warnings.lines[0].find("length 4096"), std::string::npos) << warnings.lines[0];
  const std::vector<TokenSlot> negative = Slots({-3});
  const std::vector<TokenOffset> one = Offsets({0, 1});
  const std::vector<TokenLength> one_len = Lens({1});
  ContextGatherInputs neg{ForwardMode::kExtend, one, negative, one_len, TokenCount(4096)};
  EXPECT_EQ(GatherContextTokens(neg).status().code(), absl::StatusCode::kOutOfRange);
}

// A slot outside the pool is found at every position of a span: each of the four lanes of
// the range check's unrolled loop, and its tail.
TEST(ContextGatherTest, SlotOutsidePoolIsFoundAtEveryPosition) {
  WarningCapture warnings;
  for (int bad = 0; bad < 7; ++bad) {
    std::vector<TokenSlot> idx = Slots({10, 11, 12, 13, 14, 15, 16});
    idx[bad] = TokenSlot(5000);
    const std::vector<TokenOffset> indptr = Offsets({0, 7});
    const std::vector<TokenLength> lens = Lens({7});
    const ContextGatherInputs in{ForwardMode::kExtend, indptr, idx, lens, TokenCount(4096)};
    EXPECT_EQ(GatherContextTokens(in).status().code(), absl::StatusCode::kOutOfRange)
        << "position " << bad;
  }
  EXPECT_EQ(warnings.lines.size(), 7u);
}

// The bounds at exactly the limit: the last index of kv_indices and the pool's last slot are
// in; one past either is out.
TEST(ContextGatherTest, BoundsAtExactlyTheLimit) {
  const std::vector<TokenSlot> idx = Slots({10, 11, 12, 4095});
  const std::vector<TokenLength> four = Lens({4});
  const std::vector<TokenOffset> to4 = Offsets({0, 4});
  ContextGatherInputs in{ForwardMode::kExtend, to4, idx, four, TokenCount(4096)};
  auto g = GatherContextTokens(in);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->tok_idx, idx);
  in.pool_slots = TokenCount(4095);
  EXPECT_EQ(GatherContextTokens(in).status().code(), absl::StatusCode::kOutOfRange);
  // Sequence 1 starts at index 2 and needs 3 tokens: its last index is 4 == the table length.
  const std::vector<TokenOffset> past = Offsets({0, 2, 5});
  const std::vector<TokenLength> lens = Lens({2, 3});
  ContextGatherInputs over{ForwardMode::kExtend, past, idx, lens, TokenCount(4096)};
  EXPECT_EQ(GatherContextTokens(over).status().code(), absl::StatusCode::kOutOfRange);
  const std::vector<TokenOffset> fits = Offsets({0, 2, 4});
  ContextGatherInputs exact{ForwardMode::kExtend, fits, idx, lens, TokenCount(4096)};
  auto e = GatherContextTokens(exact);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->cu_k, Offsets({0, 2, 4}));
}

TEST(ContextGatherTest, HugeLengthsFailBeforeAllocating) {
  const std::vector<TokenSlot> idx = Slots({10, 11, 12, 13});
  const std::vector<TokenOffset> indptr = Offsets({0, 2147483647});
  const std::vector<TokenLength> lens = Lens({2147483647});
  ContextGatherInputs in{ForwardMode::kExtend, indptr, idx, lens, TokenCount(100)};
  EXPECT_EQ(GatherContextTokens(in).status().code(), absl::StatusCode::kOutOfRange);
}

// A step down would let sequences read one stretch of kv_indices again, making an output
// larger than the table; an indptr must start at 0 and never decrease.
TEST(ContextGatherTest, AnIndptrThatDecreasesOrStartsElsewhereIsInvalidArgument) {
  const std::vector<TokenSlot> idx = Slots({10, 11, 12, 13});
  const std::vector<TokenLength> lens = Lens({4, 4, 4});
  const std::vector<TokenOffset> down = Offsets({0, 4, 0, 4});
  const absl::Status s =
      GatherContextTokens({ForwardMode::kExtend, down, idx, lens, TokenCount(100)}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(s.message(),
            "kv_indptr: entry 2 = 0 is less than entry 1 = 4 (must be non-decreasing)");
  const std::vector<TokenOffset> late = Offsets({1, 2, 3, 4});
  EXPECT_EQ(
      GatherContextTokens({ForwardMode::kExtend, late, idx, lens, TokenCount(100)}).status().code(),
      absl::StatusCode::kInvalidArgument);
}

TEST(ContextGatherTest, BadShapesAreInvalidArgument) {
  const std::vector<TokenSlot> idx = Slots({10, 11});
  const std::vector<TokenOffset> indptr = Offsets({0, 2});
  const std::vector<TokenLength> two_lens = Lens({2, 1});
  ContextGatherInputs in{ForwardMode::kExtend, indptr, idx, two_lens, TokenCount(64)};
  EXPECT_EQ(GatherContextTokens(in).status().code(), absl::StatusCode::kInvalidArgument);
  in.kv_lens = {};
  in.kv_indptr = {};
  EXPECT_EQ(GatherContextTokens(in).status().code(), absl::StatusCode::kInvalidArgument);
  const std::vector<TokenLength> lens = Lens({2});
  ContextGatherInputs ok{ForwardMode::kExtend, indptr, idx, lens, TokenCount(64)};
  std::vector<TokenSlot> small(1);
  std::vector<TokenOffset> cu(2);
  EXPECT_EQ(GatherContextTokens(ok, absl::MakeSpan(small), absl::MakeSpan(cu), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

// A pool size no pool can have is a malformed call: InvalidArgument without the fallback's
// WARNING, even where every slot would be in range.
TEST(ContextGatherTest, APoolSizeOutsideInt32SlotsIsInvalidArgument) {
  const std::vector<TokenSlot> idx = Slots({10, 11});
  const std::vector<TokenOffset> indptr = Offsets({0, 2});
  const std::vector<TokenLength> lens = Lens({2});
  for (const int64_t pool : {int64_t{-1}, (int64_t{1} << 31) + 1}) {
    WarningCapture warnings;
    const absl::StatusOr<ContextGather> g =
        GatherContextTokens({ForwardMode::kExtend, indptr, idx, lens, TokenCount(pool)});
    EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument) << pool;
    EXPECT_NE(g.status().message().find("pool_slots"), absl::string_view::npos) << g.status();
    EXPECT_TRUE(warnings.lines.empty()) << pool;
  }
  const std::vector<TokenOffset> empty_indptr = Offsets({0});
  EXPECT_EQ(GatherContextTokens({ForwardMode::kExtend, empty_indptr, {}, {}, TokenCount(-1)})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  const absl::StatusOr<ContextGather> widest =
      GatherContextTokens({ForwardMode::kExtend, indptr, idx, lens, TokenCount(int64_t{1} << 31)});
  ASSERT_TRUE(widest.ok()) << widest.status();
  EXPECT_EQ(widest->tok_idx, idx);
}

}  // namespace
}  // namespace attnmeta
