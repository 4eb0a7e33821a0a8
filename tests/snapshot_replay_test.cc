// Replays every snapshot in tests/snapshots/: each must rebuild to exactly its recorded
// metadata and pass the validator. A failing batch from the field becomes a regression test
// by dropping its snapshot (metadata_check's input format) into that folder.

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "attention/metadata/snapshot.h"
#include "gtest/gtest.h"

namespace attnmeta {
namespace {

TEST(SnapshotReplayTest, EverySnapshotRebuildsAndValidates) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  ASSERT_NE(srcdir, nullptr) << "run under bazel test";
  const std::filesystem::path dir =
      std::filesystem::path(srcdir) / "attnmeta" / "tests" / "snapshots";
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() == ".textproto") files.push_back(entry.path());
  }
  ASSERT_GE(files.size(), 4u) << "expected the example snapshots in " << dir;
  for (const auto& path : files) {
    SCOPED_TRACE(path.string());
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    auto snapshot = SnapshotFromText(text.str());
    ASSERT_TRUE(snapshot.ok()) << snapshot.status();
    EXPECT_TRUE(CheckSnapshot(*snapshot).ok()) << CheckSnapshot(*snapshot);
  }
}

}  // namespace
}  // namespace attnmeta
