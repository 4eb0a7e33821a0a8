// Randomly corrupted snapshots (truncated text, huge and negative values, swapped arrays) fed
// to CheckSnapshot and RewriteSnapshot: every corruption is an error status, nothing crashes
// or reads out of bounds (run it under --config=asan), and the memory in use stays bounded
// however large the values the file declares.
//
// Seeded; on failure it prints the seed, the corruption and a command that reruns it.

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "attention/metadata/snapshot.h"
#include "gtest/gtest.h"
#include "tools/bench/heap_counter.h"

namespace attnmeta {
namespace {

std::vector<std::string>* snapshot_files = nullptr;

uint64_t Seed() {
  const char* env = std::getenv("ATTNMETA_FUZZ_SEED");
  return env != nullptr ? std::strtoull(env, nullptr, 10) : 20261130;
}

// The repeated int32 fields of a snapshot where any change must be detected.
std::vector<std::pair<std::string, google::protobuf::RepeatedField<int32_t>*>> IntArrays(
    MetadataSnapshot& s) {
  std::vector<std::pair<std::string, google::protobuf::RepeatedField<int32_t>*>> out = {
      {"req_rows", s.mutable_req_rows()},     {"kv_lens", s.mutable_kv_lens()},
      {"q_lens", s.mutable_q_lens()},         {"kv_indptr", s.mutable_kv_indptr()},
      {"kv_indices", s.mutable_kv_indices()}, {"qo_indptr", s.mutable_qo_indptr()},
      {"kv_last_page_len", s.mutable_kv_last_page_len()},
      {"page_table", s.mutable_page_table()},
  };
  for (int r = 0; r < s.req_to_token_size(); ++r) {
    out.push_back({absl::StrCat("req_to_token[", r, "].slots"),
                   s.mutable_req_to_token(r)->mutable_slots()});
  }
  std::vector<std::pair<std::string, google::protobuf::RepeatedField<int32_t>*>> nonempty;
  for (auto& a : out) {
    if (a.second->size() > 0) nonempty.push_back(a);
  }
  return nonempty;
}

// Applies one random corruption; returns its description, or "" when it changed nothing.
std::string Corrupt(std::mt19937_64& rng, MetadataSnapshot& s, std::string& text) {
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  const std::vector<int64_t> huge = {int64_t{1} << 23, int64_t{1} << 30, INT32_MAX,
                                     int64_t{1} << 40, INT64_MAX};
  const std::vector<int64_t> negative = {-1, -2, -(int64_t{1} << 20), INT32_MIN, INT64_MIN};
  const std::string before = SnapshotToText(s);
  std::string what;
  switch (pick(0, 3)) {
    case 0: {  // truncated text (the trailing newline does not count)
      std::string t = before;
      while (!t.empty() && t.back() == '\n') t.pop_back();
      const size_t cut = static_cast<size_t>(pick(0, static_cast<int64_t>(t.size()) - 1));
      text = t.substr(0, cut);
      return absl::StrCat("truncated at byte ", cut, " of ", t.size());
    }
    case 1:
    case 2: {  // one value set huge or negative
      const bool big = pick(0, 1) == 0;
      const int64_t v = big ? huge[pick(0, huge.size() - 1)] : negative[pick(0, negative.size() - 1)];
      auto arrays = IntArrays(s);
      const int64_t scalar = pick(0, arrays.size() + 7);
      if (scalar < static_cast<int64_t>(arrays.size())) {
        auto& [name, field] = arrays[scalar];
        const int k = static_cast<int>(pick(0, field->size() - 1));
        field->Set(k, static_cast<int32_t>(v));
        what = absl::StrCat(name, "[", k, "] = ", static_cast<int32_t>(v));
      } else {
        switch (scalar - arrays.size()) {
          case 0: s.set_page_size(v); what = absl::StrCat("page_size = ", v); break;
          case 1: s.set_pool_slots(big ? std::max<int64_t>(v, int64_t{1} << 32) : v);
                  what = absl::StrCat("pool_slots = ", s.pool_slots()); break;
          case 2: s.set_max_reqs(big ? INT32_MAX : static_cast<int32_t>(v));
                  what = absl::StrCat("max_reqs = ", s.max_reqs()); break;
          case 3: s.set_max_context_len(big ? std::max<int64_t>(v, int64_t{1} << 40) : v);
                  what = absl::StrCat("max_context_len = ", s.max_context_len()); break;
          case 4: s.set_page_table_rows(v); what = absl::StrCat("page_table_rows = ", v); break;
          case 5: s.set_page_table_cols(v); what = absl::StrCat("page_table_cols = ", v); break;
          case 6: s.set_max_q_len(v); what = absl::StrCat("max_q_len = ", v); break;
          default: s.set_max_kv_len(v); what = absl::StrCat("max_kv_len = ", v); break;
        }
      }
      break;
    }
    default: {  // two arrays swapped
      auto arrays = IntArrays(s);
      if (arrays.size() < 2) return "";
      const int64_t a = pick(0, arrays.size() - 1);
      int64_t b = pick(0, arrays.size() - 2);
      if (b >= a) ++b;
      arrays[a].second->Swap(arrays[b].second);
      what = absl::StrCat(arrays[a].first, " <-> ", arrays[b].first);
      break;
    }
  }
  text = SnapshotToText(s);
  return text == before ? "" : what;
}

TEST(SnapshotFuzzTest, EveryCorruptionIsAnErrorWithBoundedMemory) {
  ASSERT_GE(snapshot_files->size(), 4u) << "expected the example snapshots as arguments";
  std::vector<MetadataSnapshot> good;
  for (const std::string& path : *snapshot_files) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    auto s = SnapshotFromText(text.str());
    ASSERT_TRUE(s.ok()) << path;
    ASSERT_TRUE(CheckSnapshot(*s).ok()) << path;
    good.push_back(*s);
  }
  // Under a sanitizer its runtime owns operator new: the memory bound is then checked by the
  // plain build only.
  const bool counting = bench::HeapCounterIsLive();
  const uint64_t seed = Seed();
  std::mt19937_64 rng(seed);
  constexpr int kIterations = 3000;
  constexpr int64_t kMaxPeakBytes = int64_t{64} << 20;
  const int64_t baseline = bench::HeapLiveBytes();
  bench::ResetHeapPeak();  // the peak of the loop below
  int corrupted = 0;
  for (int it = 0; it < kIterations; ++it) {
    const size_t f = static_cast<size_t>(rng() % good.size());
    MetadataSnapshot s = good[f];
    std::string text;
    const std::string what = Corrupt(rng, s, text);
    if (what.empty()) continue;
    ++corrupted;
    auto parsed = SnapshotFromText(text);
    const absl::Status check = parsed.ok() ? CheckSnapshot(*parsed) : parsed.status();
    // Rewriting may succeed (only the arrays were corrupted) or not; it must not crash.
    if (parsed.ok()) RewriteSnapshot(*parsed).IgnoreError();
    // Refused as bad input, with the codes the parser and the check document; anything else
    // (Internal, Unknown, ...) is a path nobody meant the input to reach.
    if (check.code() != absl::StatusCode::kInvalidArgument &&
        check.code() != absl::StatusCode::kOutOfRange) {
      ADD_FAILURE() << (check.ok() ? "corruption accepted: " : "corruption refused with ") << check
                    << " (" << what << " of " << (*snapshot_files)[f] << ")\nseed " << seed
                    << ", iteration " << it
                    << "; rerun: bazel test //tests:snapshot_fuzz_test"
                       " --test_env=ATTNMETA_FUZZ_SEED="
                    << seed;
      break;
    }
    ASSERT_TRUE(!counting || bench::HeapPeakBytes() - baseline < kMaxPeakBytes)
        << "memory grew to " << bench::HeapPeakBytes() << " bytes on " << what << " (seed " << seed
        << ", iteration " << it
        << "); rerun: bazel test //tests:snapshot_fuzz_test --test_env=ATTNMETA_FUZZ_SEED=" << seed;
  }
  EXPECT_GT(corrupted, kIterations * 9 / 10);
  if (counting) {
    std::printf("seed %llu: %d corruptions, all rejected; peak heap %lld bytes\n",
                static_cast<unsigned long long>(seed), corrupted,
                static_cast<long long>(bench::HeapPeakBytes() - baseline));
  } else {
    std::printf("seed %llu: %d corruptions, all rejected; heap not counted in this build\n",
                static_cast<unsigned long long>(seed), corrupted);
  }
}

}  // namespace
}  // namespace attnmeta

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  std::vector<std::string> files(argv + 1, argv + argc);
  attnmeta::snapshot_files = &files;
  return RUN_ALL_TESTS();
}
