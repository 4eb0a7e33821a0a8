// metadata_check [--rewrite] FILE...: reads MetadataSnapshot text files, rebuilds each batch's
// metadata from its recorded inputs, validates the recorded arrays and compares them with the
// rebuilt ones. Prints one line per file ("OK file" or "FAIL file: <first difference or broken
// invariant>") and exits 1 if any file fails, 2 on usage errors.
//
// --rewrite re-records each file's metadata arrays from its inputs (once the inputs validate)
// and writes the file back ("REWROTE file"): a batch captured from a buggy engine becomes a
// regression test of the fixed behaviour. A file whose inputs do not validate is left as it
// was and reported as FAIL.
//
// Under `bazel run`, relative paths are taken from the directory the command was run in.

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "attention/metadata/snapshot.h"

namespace {

std::string Resolve(const std::string& path) {
  const char* cwd = std::getenv("BUILD_WORKING_DIRECTORY");
  if (path.empty() || path[0] == '/' || cwd == nullptr) return path;
  return std::string(cwd) + "/" + path;
}

// OK, or the first error of reading, parsing, checking (or rewriting) the file.
absl::Status Process(const std::string& path, bool rewrite) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError("cannot read the file");
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<attnmeta::MetadataSnapshot> snapshot = attnmeta::SnapshotFromText(text.str());
  if (!snapshot.ok()) return snapshot.status();
  if (!rewrite) return attnmeta::CheckSnapshot(*snapshot);
  absl::StatusOr<attnmeta::MetadataSnapshot> fixed = attnmeta::RewriteSnapshot(*snapshot);
  if (!fixed.ok()) return fixed.status();
  // Written beside the file, then renamed over it: a failed write leaves the file as it was.
  const std::string temporary = path + ".rewrite";
  std::ofstream out(temporary, std::ios::trunc);
  if (!out.is_open()) return absl::UnavailableError("cannot write the file");
  out << attnmeta::SnapshotToText(*fixed);
  out.close();
  if (!out) {
    std::remove(temporary.c_str());
    return absl::UnavailableError("cannot write the file");
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    std::remove(temporary.c_str());
    return absl::UnavailableError("cannot replace the file");
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  bool rewrite = false;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--rewrite") == 0) {
      rewrite = true;
    } else if (argv[i][0] == '-' && argv[i][1] == '-') {
      std::fprintf(stderr, "metadata_check: unknown flag %s\n", argv[i]);
      return 2;
    } else {
      files.push_back(argv[i]);
    }
  }
  if (files.empty()) {
    std::fprintf(stderr, "usage: %s [--rewrite] SNAPSHOT.textproto...\n", argv[0]);
    return 2;
  }
  int failures = 0;
  for (const std::string& file : files) {
    const absl::Status status = Process(Resolve(file), rewrite);
    if (status.ok()) {
      std::printf("%s %s\n", rewrite ? "REWROTE" : "OK", file.c_str());
    } else {
      std::printf("FAIL %s: %s\n", file.c_str(), std::string(status.message()).c_str());
      ++failures;
    }
  }
  return failures == 0 ? 0 : 1;
}
