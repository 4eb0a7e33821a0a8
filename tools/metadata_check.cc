// metadata_check FILE...: reads MetadataSnapshot text files, rebuilds each batch's metadata
// from its recorded inputs, validates the recorded arrays and compares them with the rebuilt
// ones. Prints one line per file ("OK file" or "FAIL file: <first difference or broken
// invariant>") and exits 1 if any file fails, 2 on usage errors.

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "attention/metadata/snapshot.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s SNAPSHOT.textproto...\n", argv[0]);
    return 2;
  }
  int failures = 0;
  for (int i = 1; i < argc; ++i) {
    std::ifstream in(argv[i]);
    if (!in) {
      std::printf("FAIL %s: cannot read the file\n", argv[i]);
      ++failures;
      continue;
    }
    std::stringstream text;
    text << in.rdbuf();
    absl::StatusOr<attnmeta::MetadataSnapshot> snapshot = attnmeta::SnapshotFromText(text.str());
    absl::Status status =
        snapshot.ok() ? attnmeta::CheckSnapshot(*snapshot) : snapshot.status();
    if (status.ok()) {
      std::printf("OK %s\n", argv[i]);
    } else {
      std::printf("FAIL %s: %s\n", argv[i], std::string(status.message()).c_str());
      ++failures;
    }
  }
  return failures == 0 ? 0 : 1;
}
