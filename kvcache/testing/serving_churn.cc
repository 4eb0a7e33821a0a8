#include "kvcache/testing/serving_churn.h"

#include <algorithm>
#include <deque>
#include <limits>
#include <random>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "kvcache/paged_token_allocator.h"

namespace attnmeta {
namespace testing {
namespace {

absl::Status CheckInputs(int64_t pool_slots, int64_t requests, TokenCount ctx,
                         const ServingChurnOptions& o) {
  if (pool_slots < 2 || pool_slots > PagedTokenAllocator::kMaxSlots || requests < 1 ||
      ctx.value() < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("serving churn: pool_slots ", pool_slots, " (want [2, 2^31]), requests ",
                     requests, " (want >= 1), ctx ", ctx.value(), " (want >= 2)"));
  }
  if (o.running < 1 || o.prompt_min < 1 || o.prompt_min > o.prompt_max || o.decodes_min < 1 ||
      o.decodes_min > o.decodes_max || o.turnovers < 0 || o.decode_tail < 0 ||
      o.decode_tail > ctx.value() - 1) {
    return absl::InvalidArgumentError("serving churn: options out of range");
  }
  if (o.turnovers > std::numeric_limits<int64_t>::max() / pool_slots) {
    return absl::InvalidArgumentError(absl::StrCat("serving churn: ", o.turnovers, " turnovers of ",
                                                   pool_slots, " slots overflow a count of slots"));
  }
  // Checked before the churn so that the output's size cannot overflow or be reserved first.
  if (ctx.value() > (pool_slots - 1) / requests) {
    return absl::ResourceExhaustedError(
        absl::StrCat("serving churn: ", requests, " measured requests of ", ctx.value(),
                     " tokens do not fit ", pool_slots - 1, " usable slots"));
  }
  return absl::OkStatus();
}

// One modelled request: its slots in token order.
struct Request {
  std::vector<TokenSlot> slots;
  int64_t decodes_left = 0;
};

class Server {
 public:
  explicit Server(PagedTokenAllocator alloc) : alloc_(std::move(alloc)) {}

  // A new request holding a prompt of `tokens` slots.
  absl::StatusOr<Request> Arrive(int64_t tokens) {
    if (absl::Status s = MakeRoom(tokens); !s.ok()) return s;
    const ExtendRequest e{TokenCount(0), TokenCount(tokens), TokenSlot(0)};
    absl::StatusOr<std::vector<TokenSlot>> slots =
        alloc_.AllocateExtend(absl::MakeConstSpan(&e, 1));
    if (!slots.ok()) return slots.status();
    return Request{*std::move(slots), 0};
  }

  // One decode step: a new slot for each request.
  absl::Status Step(std::vector<Request>& batch) {
    if (absl::Status s = MakeRoom(static_cast<int64_t>(batch.size())); !s.ok()) return s;
    std::vector<DecodeRequest> step;
    step.reserve(batch.size());
    for (const Request& r : batch) {
      step.push_back({TokenCount(static_cast<int64_t>(r.slots.size()) + 1), r.slots.back()});
    }
    absl::StatusOr<std::vector<TokenSlot>> fresh = alloc_.AllocateDecode(step);
    if (!fresh.ok()) return fresh.status();
    for (size_t i = 0; i < batch.size(); ++i) batch[i].slots.push_back((*fresh)[i]);
    return absl::OkStatus();
  }

  // A finished request's slots stay allocated until room is needed.
  void Cache(std::vector<TokenSlot> slots) { cached_.push_back(std::move(slots)); }

 private:
  // Frees the oldest cached requests until `tokens` slots are free.
  absl::Status MakeRoom(int64_t tokens) {
    while (alloc_.free_pages().value() < tokens) {
      if (cached_.empty()) {
        return absl::ResourceExhaustedError(
            absl::StrCat("serving churn: ", tokens, " slots wanted, ", alloc_.free_pages().value(),
                         " free, and the running requests hold the rest of the pool"));
      }
      if (absl::Status s = alloc_.Free(cached_.front()); !s.ok()) return s;
      cached_.pop_front();
    }
    return absl::OkStatus();
  }

  PagedTokenAllocator alloc_;
  std::deque<std::vector<TokenSlot>> cached_;  // oldest first
};

}  // namespace

absl::StatusOr<std::vector<TokenSlot>> ServingChurnSlots(int64_t pool_slots, int64_t requests,
                                                         TokenCount ctx, uint64_t seed,
                                                         const ServingChurnOptions& options) {
  if (absl::Status s = CheckInputs(pool_slots, requests, ctx, options); !s.ok()) return s;
  absl::StatusOr<PagedTokenAllocator> alloc = PagedTokenAllocator::Create(
      PageCount(pool_slots - 1), *PageSize::Create(1), FreePagePolicy::InOrder());
  if (!alloc.ok()) return alloc.status();
  Server server(*std::move(alloc));
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> prompt(options.prompt_min, options.prompt_max);
  std::uniform_int_distribution<int64_t> decodes(options.decodes_min, options.decodes_max);
  std::vector<Request> running;
  int64_t handed_out = 0;
  while (handed_out < options.turnovers * pool_slots) {
    while (static_cast<int64_t>(running.size()) < options.running) {
      absl::StatusOr<Request> r = server.Arrive(prompt(rng));
      if (!r.ok()) return r.status();
      r->decodes_left = decodes(rng);
      handed_out += static_cast<int64_t>(r->slots.size());
      running.push_back(*std::move(r));
    }
    if (absl::Status s = server.Step(running); !s.ok()) return s;
    handed_out += static_cast<int64_t>(running.size());
    for (size_t i = 0; i < running.size();) {
      if (--running[i].decodes_left == 0) {
        server.Cache(std::move(running[i].slots));
        running[i] = std::move(running.back());
        running.pop_back();
      } else {
        ++i;
      }
    }
  }
  std::vector<Request> measured;
  measured.reserve(requests);
  for (int64_t i = 0; i < requests; ++i) {
    absl::StatusOr<Request> r = server.Arrive(ctx.value() - options.decode_tail);
    if (!r.ok()) return r.status();
    measured.push_back(*std::move(r));
  }
  for (int64_t k = 0; k < options.decode_tail; ++k) {
    if (absl::Status s = server.Step(measured); !s.ok()) return s;
  }
  std::vector<TokenSlot> out;
  out.reserve(requests * ctx.value());
  for (const Request& r : measured) out.insert(out.end(), r.slots.begin(), r.slots.end());
  return out;
}

SlotLocality MeasureSlotLocality(const std::vector<TokenSlot>& slots, TokenCount ctx,
                                 int64_t region_slots) {
  const int64_t n = ctx.value();
  const int64_t requests = static_cast<int64_t>(slots.size()) / n;
  int64_t neighbours = 0, regions = 0;
  std::vector<int64_t> r(n);
  for (int64_t i = 0; i < requests; ++i) {
    const TokenSlot* s = slots.data() + i * n;
    for (int64_t t = 0; t < n; ++t) {
      if (t > 0) {
        const int64_t step = int64_t{s[t].value()} - s[t - 1].value();
        neighbours += step == 1 || step == -1;
      }
      r[t] = s[t].value() / region_slots;
    }
    std::sort(r.begin(), r.end());
    regions += std::unique(r.begin(), r.end()) - r.begin();
  }
  return SlotLocality{static_cast<double>(neighbours) / (requests * (n - 1)),
                      static_cast<double>(regions) / requests};
}

}  // namespace testing
}  // namespace attnmeta
