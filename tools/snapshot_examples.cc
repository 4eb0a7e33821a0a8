// snapshot_examples DIR: writes one MetadataSnapshot per forward mode (page_size 16, shuffled
// pages, unaligned lengths, a shared prefix) to DIR/<mode>.textproto. Used to seed
// tests/snapshots/ and as a template for recording a field batch.

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "attention/metadata/builders.h"
#include "attention/metadata/snapshot.h"
#include "attention/metadata/testing/batch_fixture.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  using attnmeta::ForwardMode;
  for (ForwardMode mode : {ForwardMode::kDecode, ForwardMode::kExtend, ForwardMode::kMixed,
                           ForwardMode::kIdle, ForwardMode::kDraftExtend,
                           ForwardMode::kTargetVerify}) {
    attnmeta::testing::BatchFixture f(16, 7, /*num_pages=*/64, /*max_reqs=*/8,
                                      /*max_context=*/256);
    const bool speculative =
        mode == ForwardMode::kDraftExtend || mode == ForwardMode::kTargetVerify;
    if (speculative) {
      // Three draft tokens per request; target-verify's tree: a root with two children.
      f.AddSequence(37, 3);
      f.AddSequence(20, 3);
      f.AddSequenceSharingPrefix(0, 32, 33, 3);
    } else if (mode != ForwardMode::kIdle) {
      const bool decode = mode == ForwardMode::kDecode;
      f.AddSequence(37, decode ? 1 : 5);
      f.AddSequence(decode ? 20 : 0, decode ? 1 : 19);
      f.AddSequenceSharingPrefix(0, 32, 33, mode == ForwardMode::kExtend ? 2 : 1);
    }
    const std::vector<uint8_t> tree = {1, 0, 0, 1, 1, 0, 1, 0, 1,  //
                                       1, 0, 0, 1, 1, 0, 1, 0, 1,  //
                                       1, 0, 0, 1, 1, 0, 1, 0, 1};
    attnmeta::ForwardBatch batch = f.Batch(mode);
    attnmeta::BuildOptions options;
    if (mode == ForwardMode::kTargetVerify) {
      batch.tree_mask = tree;
      options.mask_layout = attnmeta::MaskLayout::kFull;
    }
    auto m = attnmeta::BuildForwardMetadata(batch, f.pool(), f.page_size(), options);
    if (!m.ok()) {
      std::fprintf(stderr, "%s\n", m.status().ToString().c_str());
      return 1;
    }
    auto snapshot = attnmeta::MakeSnapshot(batch, f.pool(), f.page_size(), f.pool_slots(), *m);
    if (!snapshot.ok()) {
      std::fprintf(stderr, "%s\n", snapshot.status().ToString().c_str());
      return 1;
    }
    attnmeta::MetadataSnapshot& s = *snapshot;
    s.set_note("example " + std::string(attnmeta::ForwardModeName(mode)) +
               " batch written by //tools:snapshot_examples");
    const std::string path = std::string(argv[1]) + "/" +
                             std::string(attnmeta::ForwardModeName(mode)) + ".textproto";
    std::ofstream out(path);
    out << attnmeta::SnapshotToText(s);
    out.close();
    if (!out) {
      std::fprintf(stderr, "snapshot_examples: cannot write %s\n", path.c_str());
      return 1;
    }
  }
  return 0;
}
