#include "sim/workload.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "attention/graph/backend_config.h"
#include "attention/graph/buffer_plan.h"
#include "attention/metadata/draft_decode_layout.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"
#include "spec_decode/verify_tree.h"

extern const char kAttnmetaDefaultWorkloadText[];

namespace attnmeta {
namespace {

absl::Status Bad(absl::string_view path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

bool IsName(absl::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_';
    if (!ok) return false;
  }
  return true;
}

// The pages a request holds at most, alone, at page size `ps`, by the simulator's own
// allocations: its prompt and output, and in a speculative round (at seq_len L <= prompt +
// output - 2: the round's last output token is not yet in the pool) the draft runs of
// draft-decode, each branch on its own pages (DraftRowTokens), or the verify tree's slots.
// REQUIRES: prompt_len, output_len >= 1; prompt + output <= max_context_len.
int64_t PeakPages(const Scenario& s, const Request& r, int64_t ps) {
  const SpeculativeConfig& spec = s.backend().speculative();
  const PageSize page_size = *PageSize::Create(ps);
  int64_t tokens = int64_t{r.prompt_len()} + r.output_len();
  if (spec.draft_tokens() > 0 && tokens >= 2) {
    const int64_t last_round = tokens - 2;
    const TokenCount draft_runs =
        MaxDraftRowTokens(TokenLength(static_cast<int32_t>(last_round)),
                          DraftDecodeShape{spec.topk(), spec.steps()}, page_size);
    tokens = std::max({tokens, draft_runs.value(), last_round + spec.draft_tokens()});
  }
  return PagesForTokensCeil(TokenCount(tokens), page_size).value();
}

absl::Status ValidateScenario(const Workload& w, const Scenario& s, absl::string_view path) {
  std::vector<int64_t> graph_bytes;  // per page size of w
  for (int64_t ps : w.page_sizes()) {
    BackendConfig config = s.backend();
    config.set_page_size(ps);
    if (absl::Status st = ValidateBackendConfig(config); !st.ok()) {
      return Bad(absl::StrCat(path, ".backend"),
                 absl::StrCat("at page size ", ps, ": ", st.message()));
    }
    absl::StatusOr<BufferPlan> plan = ComputeBufferPlan(config, config.max_batch_size());
    if (!plan.ok()) {
      return Bad(absl::StrCat(path, ".backend"),
                 absl::StrCat("at page size ", ps, ": ", plan.status().message()));
    }
    if (plan->total_bytes > kMaxSimulatedBytes) {
      return Bad(absl::StrCat(path, ".backend"),
                 absl::StrCat("at page size ", ps, " the graph buffers take ", plan->total_bytes,
                              " bytes; the simulator holds at most ", kMaxSimulatedBytes));
    }
    graph_bytes.push_back(plan->total_bytes);
  }
  if (s.kv_pool_tokens() < 1) return Bad(absl::StrCat(path, ".kv_pool_tokens"), "must be >= 1");
  // The simulator keeps float K and V for every slot of the pool and, for a checked forward,
  // at most one query row, its expected and computed outputs, and a K and V row of scratch per
  // slot: 4 K/V rows and 3 query rows of floats per slot. Each product is checked before it is
  // formed (the heads and the head dim are int32, so their product fits).
  const int64_t kv_row = int64_t{s.backend().num_kv_heads()} * s.backend().head_dim();
  const int64_t q_row = int64_t{s.backend().num_q_heads()} * s.backend().head_dim();
  // kv_row <= q_row (num_kv_heads divides num_q_heads), so slot_bytes <= 28 * q_row.
  if (q_row > kMaxSimulatedBytes / 28) {
    return Bad(absl::StrCat(path, ".backend"),
               absl::StrCat(s.backend().num_q_heads(), " query heads of dimension ",
                            s.backend().head_dim(), " take more than the ", kMaxSimulatedBytes,
                            " bytes the simulator holds"));
  }
  const int64_t slot_bytes = 4 * (4 * kv_row + 3 * q_row);
  std::vector<int64_t> pool_bytes;  // per page size of w
  for (int64_t ps : w.page_sizes()) {
    const int64_t pages = s.kv_pool_tokens() / ps;
    if (pages < 1) {
      return Bad(absl::StrCat(path, ".kv_pool_tokens"),
                 absl::StrCat(s.kv_pool_tokens(), " tokens are less than one page of ", ps));
    }
    // The pool's slots: its pages and the padding page, (pages + 1) * ps <= 2^31.
    if (pages > (int64_t{1} << 31) / ps - 1) {
      return Bad(absl::StrCat(path, ".kv_pool_tokens"), "the pool's slots exceed 2^31");
    }
    const int64_t slots = (pages + 1) * ps;
    if (slot_bytes > kMaxSimulatedBytes / slots) {
      return Bad(absl::StrCat(path, ".kv_pool_tokens"),
                 absl::StrCat("at page size ", ps, " the pool's ", slots, " slots of ",
                              s.backend().num_kv_heads(), " KV heads and ",
                              s.backend().num_q_heads(), " query heads of dimension ",
                              s.backend().head_dim(), " take more than the ", kMaxSimulatedBytes,
                              " bytes the simulator holds"));
    }
    pool_bytes.push_back(slots * slot_bytes);
  }
  if (s.max_running_requests() < 1) {
    return Bad(absl::StrCat(path, ".max_running_requests"), "must be >= 1");
  }
  if (s.chunked_prefill_tokens() < 1) {
    return Bad(absl::StrCat(path, ".chunked_prefill_tokens"), "must be >= 1");
  }
  if (s.max_steps() < 1) return Bad(absl::StrCat(path, ".max_steps"), "must be >= 1");
  const SpeculativeConfig& spec = s.backend().speculative();
  if (spec.draft_tokens() > 0) {
    if (spec.draft_tokens() > kMaxVerifyTreeTokens) {
      return Bad(absl::StrCat(path, ".backend.speculative.draft_tokens"),
                 absl::StrCat("at most ", kMaxVerifyTreeTokens));
    }
    if (spec.topk() < 1 || spec.steps() < 1) {
      return Bad(absl::StrCat(path, ".backend.speculative"),
                 "EAGLE (draft_tokens > 0) needs topk >= 1 and steps >= 1");
    }
    // Written so that NaN fails too.
    if (!s.has_acceptance() ||
        !(s.acceptance().probability() >= 0 && s.acceptance().probability() <= 1)) {
      return Bad(absl::StrCat(path, ".acceptance.probability"),
                 "speculative decoding needs a probability in [0, 1]");
    }
  }
  // One run holds its graph buffers, its pool's floats and its req_to_token table at once.
  // Graph and pool are each at most kMaxSimulatedBytes (checked above), so their sum is formed
  // safely; the table's product is compared by division before it is formed.
  for (int k = 0; k < w.page_sizes_size(); ++k) {
    const int64_t ps = w.page_sizes(k);
    const int64_t rest = kMaxSimulatedBytes - graph_bytes[k] - pool_bytes[k];
    const int64_t width = ReqToTokenWidth(s, *PageSize::Create(ps)).value();
    const int64_t rows = s.max_running_requests();
    constexpr int64_t kEntry = sizeof(int32_t);
    if (rest < 0 || width > rest / kEntry / rows) {
      return Bad(path,
                 absl::StrCat("at page size ", ps, " a run holds ", graph_bytes[k],
                              " bytes of graph buffers, ", pool_bytes[k], " of pool floats and ",
                              rows, " req_to_token rows of ", width, " slots: more than the ",
                              kMaxSimulatedBytes, " bytes the simulator holds"));
    }
  }
  if (s.requests().empty()) return Bad(absl::StrCat(path, ".requests"), "no requests");
  absl::flat_hash_map<int32_t, int32_t> group_prefix;
  for (int i = 0; i < s.requests_size(); ++i) {
    const Request& r = s.requests(i);
    const std::string rp = absl::StrCat(path, ".requests[", i, "]");
    if (r.arrival_step() < 0) return Bad(absl::StrCat(rp, ".arrival_step"), "must be >= 0");
    if (r.arrival_step() >= s.max_steps()) {
      return Bad(absl::StrCat(rp, ".arrival_step"),
                 absl::StrCat(r.arrival_step(), " is not before max_steps ", s.max_steps()));
    }
    if (r.prompt_len() < 1) return Bad(absl::StrCat(rp, ".prompt_len"), "must be >= 1");
    if (r.output_len() < 1) return Bad(absl::StrCat(rp, ".output_len"), "must be >= 1");
    if (int64_t{r.prompt_len()} + r.output_len() > s.backend().max_context_len()) {
      return Bad(absl::StrCat(rp, ".output_len"),
                 absl::StrCat("prompt + output = ", int64_t{r.prompt_len()} + r.output_len(),
                              " tokens exceed max_context_len ", s.backend().max_context_len()));
    }
    for (int64_t ps : w.page_sizes()) {
      // A request alone must fit, or the scheduler could never run it.
      const int64_t pages = PeakPages(s, r, ps);
      if (pages > s.kv_pool_tokens() / ps) {
        return Bad(rp, absl::StrCat("needs up to ", pages, " pages of ", ps,
                                    " tokens; the pool has ", s.kv_pool_tokens() / ps));
      }
    }
    if (r.prefix_group() < 0) return Bad(absl::StrCat(rp, ".prefix_group"), "must be >= 0");
    if (r.prefix_group() == 0) {
      if (r.shared_prefix_len() != 0) {
        return Bad(absl::StrCat(rp, ".shared_prefix_len"), "set without a prefix_group");
      }
      continue;
    }
    if (r.shared_prefix_len() < 1 || r.shared_prefix_len() > r.prompt_len()) {
      return Bad(absl::StrCat(rp, ".shared_prefix_len"),
                 absl::StrCat(r.shared_prefix_len(), " is outside [1, prompt_len ",
                              r.prompt_len(), "]"));
    }
    auto [it, inserted] = group_prefix.emplace(r.prefix_group(), r.shared_prefix_len());
    if (!inserted && it->second != r.shared_prefix_len()) {
      return Bad(absl::StrCat(rp, ".shared_prefix_len"),
                 absl::StrCat(r.shared_prefix_len(), " differs from ", it->second,
                              ", the group's earlier requests' shared prefix"));
    }
  }
  return absl::OkStatus();
}

class CollectFirstError : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    if (first_.empty()) first_ = absl::StrCat("line ", line + 1, ":", column + 1, ": ", message);
  }
  const std::string& first() const { return first_; }

 private:
  std::string first_;
};

}  // namespace

absl::Status ValidateWorkload(const Workload& w) {
  if (w.page_sizes().empty()) return Bad("page_sizes", "no page sizes");
  for (int i = 0; i < w.page_sizes_size(); ++i) {
    if (!PageSize::Create(w.page_sizes(i)).ok()) {
      return Bad(absl::StrCat("page_sizes[", i, "]"),
                 absl::StrCat(w.page_sizes(i), " is outside [1, ", PageSize::kMaxTokens, "]"));
    }
  }
  if (w.check_steps() < 0) return Bad("check_steps", "must be >= 0");
  if (w.scenarios().empty()) return Bad("scenarios", "no scenarios");
  absl::flat_hash_set<std::string> names;
  for (int i = 0; i < w.scenarios_size(); ++i) {
    const Scenario& s = w.scenarios(i);
    const std::string path = absl::StrCat("scenarios[", i, "]");
    if (!IsName(s.name())) {
      return Bad(absl::StrCat(path, ".name"), absl::StrCat("\"", s.name(), "\" is not [A-Za-z0-9_]+"));
    }
    if (!names.insert(s.name()).second) {
      return Bad(absl::StrCat(path, ".name"), absl::StrCat("\"", s.name(), "\" repeats"));
    }
    if (absl::Status st = ValidateScenario(w, s, path); !st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::StatusOr<Workload> ParseWorkloadText(absl::string_view text) {
  Workload w;
  google::protobuf::TextFormat::Parser parser;
  CollectFirstError errors;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(std::string(text), &w)) {
    return absl::InvalidArgumentError(absl::StrCat("not a Workload in text format: ", errors.first()));
  }
  return w;
}

absl::StatusOr<Workload> ParseWorkload(absl::string_view text) {
  absl::StatusOr<Workload> w = ParseWorkloadText(text);
  if (!w.ok()) return w.status();
  if (absl::Status st = ValidateWorkload(*w); !st.ok()) return st;
  return w;
}

absl::string_view DefaultWorkloadText() { return kAttnmetaDefaultWorkloadText; }

TokenCount ReqToTokenWidth(const Scenario& scenario, PageSize page_size) {
  const BackendConfig& config = scenario.backend();
  const SpeculativeConfig& spec = config.speculative();
  TokenCount width(int64_t{config.max_context_len()} + spec.draft_tokens());
  if (spec.draft_tokens() > 0) {
    width = std::max(width,
                     MaxDraftRowTokens(TokenLength(static_cast<int32_t>(config.max_context_len())),
                                       DraftDecodeShape{spec.topk(), spec.steps()}, page_size));
  }
  return width;
}

BackendConfig ScenarioConfig(const Scenario& scenario, PageSize page_size) {
  BackendConfig config = scenario.backend();
  config.set_page_size(page_size.tokens());
  return config;
}

}  // namespace attnmeta
