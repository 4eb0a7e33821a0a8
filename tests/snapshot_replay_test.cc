// Replays every snapshot in tests/snapshots/: each must rebuild to exactly its recorded
// metadata and pass the validator. A failing batch from the field becomes a regression test
// by dropping its snapshot (metadata_check's input format) into that folder.

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "attention/metadata/snapshot.h"
#include "gtest/gtest.h"

namespace attnmeta {
namespace {

std::vector<std::string>* snapshot_files = nullptr;

// The snapshot files come as arguments (BUILD passes $(rootpaths) of the folder), so the
// test works whatever the workspace is called.
TEST(SnapshotReplayTest, EverySnapshotRebuildsAndValidates) {
  ASSERT_GE(snapshot_files->size(), 4u) << "expected the example snapshots as arguments";
  for (const std::string& path : *snapshot_files) {
    SCOPED_TRACE(path);
    std::ifstream in(path);
    ASSERT_TRUE(in.good()) << "cannot read " << path;
    std::stringstream text;
    text << in.rdbuf();
    auto snapshot = SnapshotFromText(text.str());
    ASSERT_TRUE(snapshot.ok()) << snapshot.status();
    EXPECT_TRUE(CheckSnapshot(*snapshot).ok()) << CheckSnapshot(*snapshot);
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
