// Prints the decode metadata of a small batch built through attnmeta.

#include <cstdio>

#include "decode_step.h"

int main() {
  auto m = consumer::DecodeStepAfterPrefill({37, 5, 64}, /*page_size=*/16, /*num_pages=*/64,
                                            /*seed=*/7, /*query_rows=*/3);
  if (!m.ok()) {
    std::fprintf(stderr, "%s\n", m.status().ToString().c_str());
    return 1;
  }
  std::printf("batch of %lld: kv_indptr", static_cast<long long>(m->view().batch_size()));
  for (auto o : m->kv_indptr) std::printf(" %d", o.value());
  std::printf(", max_kv_len %lld, page table %lld x %lld\n",
              static_cast<long long>(m->max_kv_len.value()),
              static_cast<long long>(m->page_table.rows()),
              static_cast<long long>(m->page_table.cols().value()));
  return 0;
}
