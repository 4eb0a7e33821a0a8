#include "spec_decode/verify_tree.h"

#include <limits>

#include "absl/strings/str_cat.h"

namespace attnmeta {
namespace {

absl::Status CheckCommon(absl::Span<const TokenLength> seq_lens, int32_t n) {
  if (n < 1 || n > kMaxVerifyTreeTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_draft_tokens ", n, " outside [1, ", kMaxVerifyTreeTokens, "]"));
  }
  // retrieve_index holds b * n + t as int32.
  if (static_cast<int64_t>(seq_lens.size()) * n > std::numeric_limits<int32_t>::max()) {
    return absl::OutOfRangeError(absl::StrCat(seq_lens.size(), " requests of ", n,
                                              " draft tokens: more tree tokens than int32"));
  }
  for (size_t b = 0; b < seq_lens.size(); ++b) {
    if (seq_lens[b].value() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("seq_lens[", b, "] = ", seq_lens[b].value(), " is negative"));
    }
    // The tree's positions reach seq_len + n - 1 and its KV seq_len + n (WriteTreeMask).
    if (int64_t{seq_lens[b].value()} + n > std::numeric_limits<int32_t>::max()) {
      return absl::OutOfRangeError(absl::StrCat("seq_lens[", b, "] = ", seq_lens[b].value(),
                                                " with ", n, " draft tokens: beyond int32"));
    }
  }
  return absl::OkStatus();
}

// Fills everything but `parent` (already set) by walking each token towards the root at
// most `max_walk` steps: its mask row (the root, itself and the ancestors walked), its
// position, and the links. InvalidArgument for a cycle, found first, before anything is
// filled.
absl::Status Finish(int32_t max_walk, VerifyTree& tree) {
  const int32_t n = tree.num_draft_tokens.value();
  const int64_t bs = tree.batch_size();
  // A walk that has not ended after n steps went round a cycle.
  for (int64_t b = 0; b < bs; ++b) {
    const int32_t* parent = tree.parent.data() + b * n;
    for (int32_t t = 1; t < n; ++t) {
      int32_t cur = t;
      for (int32_t steps = 0; cur > 0 && steps <= n; ++steps) cur = parent[cur];
      if (cur > 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "request ", b, ": token ", t, " reaches itself through its parents (a cycle)"));
      }
    }
  }
  tree.sees.assign(static_cast<size_t>(bs * n * n), 0);
  tree.positions.assign(static_cast<size_t>(bs * n), TokenPosition(0));
  tree.retrieve_index.assign(static_cast<size_t>(bs * n), 0);
  tree.next_token.assign(static_cast<size_t>(bs * n), -1);
  tree.next_sibling.assign(static_cast<size_t>(bs * n), -1);
  for (int64_t b = 0; b < bs; ++b) {
    const int32_t* parent = tree.parent.data() + b * n;
    for (int32_t t = 0; t < n; ++t) {
      uint8_t* row = tree.sees.data() + (b * n + t) * n;
      row[0] = 1;
      int32_t steps = 0;
      for (int32_t cur = t; cur > 0 && steps < max_walk; cur = parent[cur]) {
        row[cur] = 1;
        ++steps;
      }
      tree.positions[b * n + t] =
          TokenPosition(static_cast<int32_t>(tree.seq_lens[b].value() + steps));
      tree.retrieve_index[b * n + t] = static_cast<int32_t>(b * n + t);
    }
    // Children are pushed in descending order, so each list ends up ascending.
    for (int32_t i = n - 1; i > 0; --i) {
      const int32_t p = parent[i];
      if (p < 0) continue;
      tree.next_sibling[b * n + i] = tree.next_token[b * n + p];
      tree.next_token[b * n + p] = i;
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<VerifyTree> BuildVerifyTree(absl::Span<const int64_t> parent_list,
                                           absl::Span<const int64_t> selected_index,
                                           absl::Span<const TokenLength> seq_lens, int32_t topk,
                                           int32_t depth, TokenLength num_draft_tokens) {
  const int32_t n = num_draft_tokens.value();
  if (absl::Status s = CheckCommon(seq_lens, n); !s.ok()) return s;
  if (topk < 1 || depth < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("topk ", topk, " and depth ", depth, " must be at least 1"));
  }
  const int64_t bs = static_cast<int64_t>(seq_lens.size());
  const int64_t list_len = int64_t{topk} * (depth - 1) + 1;
  // Compared by division: bs * list_len can pass INT64_MAX (topk and depth near 2^31).
  if (parent_list.size() % static_cast<uint64_t>(list_len) != 0 ||
      parent_list.size() / static_cast<uint64_t>(list_len) != static_cast<uint64_t>(bs) ||
      static_cast<int64_t>(selected_index.size()) != bs * (n - 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parent_list has ", parent_list.size(), " entries and selected_index ",
        selected_index.size(), "; want ", bs, " requests of ", list_len, " and ", n - 1));
  }
  VerifyTree tree;
  tree.num_draft_tokens = num_draft_tokens;
  tree.seq_lens.assign(seq_lens.begin(), seq_lens.end());
  tree.parent.assign(static_cast<size_t>(bs * n), -1);
  for (int64_t b = 0; b < bs; ++b) {
    const int64_t* sel = selected_index.data() + b * (n - 1);
    const int64_t* list = parent_list.data() + b * list_len;
    for (int32_t i = 1; i < n; ++i) {
      if (sel[i - 1] < 0 || sel[i - 1] / topk >= list_len) {
        return absl::InvalidArgumentError(absl::StrCat(
            "selected_index[", b, "][", i - 1, "] = ", sel[i - 1], ": parent slot ",
            sel[i - 1] / topk, " outside parent_list's ", list_len, " entries"));
      }
      const int64_t p = sel[i - 1] / topk;
      if (p == 0) {
        tree.parent[b * n + i] = 0;
        continue;
      }
      // Searched among this request's own n - 1 entries only; not found: left out.
      for (int32_t j = 0; j < n - 1; ++j) {
        if (sel[j] == list[p]) {
          tree.parent[b * n + i] = j + 1;
          break;
        }
      }
    }
  }
  if (absl::Status s = Finish(depth, tree); !s.ok()) return s;
  return tree;
}

absl::StatusOr<VerifyTree> BuildVerifyTreeFromParents(absl::Span<const int32_t> parents,
                                                      absl::Span<const TokenLength> seq_lens,
                                                      TokenLength num_draft_tokens) {
  const int32_t n = num_draft_tokens.value();
  if (absl::Status s = CheckCommon(seq_lens, n); !s.ok()) return s;
  const int64_t bs = static_cast<int64_t>(seq_lens.size());
  if (static_cast<int64_t>(parents.size()) != bs * n) {
    return absl::InvalidArgumentError(
        absl::StrCat("parents has ", parents.size(), " entries, want ", bs, " * ", n));
  }
  for (int64_t b = 0; b < bs; ++b) {
    for (int32_t t = 0; t < n; ++t) {
      const int32_t p = parents[b * n + t];
      if (t == 0 && p != -1) {
        return absl::InvalidArgumentError(
            absl::StrCat("parents[", b, "][0] = ", p, ": the root (token 0) has no parent"));
      }
      if (t > 0 && (p < 0 || p >= n)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "parents[", b, "][", t, "] = ", p,
            p < 0 ? ": a second root" : ": outside the request's tokens", " (want [0, ", n, "))"));
      }
    }
  }
  VerifyTree tree;
  tree.num_draft_tokens = num_draft_tokens;
  tree.seq_lens.assign(seq_lens.begin(), seq_lens.end());
  tree.parent.assign(parents.begin(), parents.end());
  if (absl::Status s = Finish(n, tree); !s.ok()) return s;
  return tree;
}

absl::Status WriteTreeMask(const VerifyTree& tree, MaskLayout layout, absl::Span<uint8_t> out,
                           absl::Span<int64_t> mask_indptr) {
  const int64_t bs = tree.batch_size();
  std::vector<TokenLength> q_lens(bs, tree.num_draft_tokens);
  std::vector<TokenLength> kv_lens(bs);
  for (int64_t b = 0; b < bs; ++b) {
    const int64_t kv = int64_t{tree.seq_lens[b].value()} + tree.num_draft_tokens.value();
    if (kv > std::numeric_limits<int32_t>::max()) {
      return absl::OutOfRangeError(absl::StrCat("verify tree: request ", b, " has ", kv,
                                                " KV tokens, beyond int32"));
    }
    kv_lens[b] = TokenLength(static_cast<int32_t>(kv));
  }
  // Into a local indptr first, so that nothing is written when `out` is too small.
  std::vector<int64_t> indptr(bs + 1);
  if (absl::Status s = BuildMaskIndptr(layout, q_lens, kv_lens, absl::MakeSpan(indptr)); !s.ok()) {
    return s;
  }
  if (mask_indptr.size() != indptr.size()) {
    return absl::InvalidArgumentError(absl::StrCat("mask_indptr has ", mask_indptr.size(),
                                                   " entries, want ", indptr.size()));
  }
  // A tree built here sees its root; a hand-built one is held to the same rule.
  if (absl::Status s = CheckTreeRows(tree.sees, q_lens, /*draft_tree=*/true); !s.ok()) return s;
  if (absl::Status s = BuildCustomMask(layout, tree.sees, q_lens, kv_lens, indptr, out); !s.ok()) {
    return s;
  }
  std::copy(indptr.begin(), indptr.end(), mask_indptr.begin());
  return absl::OkStatus();
}

}  // namespace attnmeta
