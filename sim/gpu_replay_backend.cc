#include "sim/gpu_replay_backend.h"

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "attention/kernels/device_metadata_writer.h"
#include "attention/kernels/device_span.h"
#include "attention/kernels/device_violation_word.h"
#include "attention/kernels/half_bits.h"
#include "attention/kernels/hip_device_memory.h"
#include "attention/kernels/hip_port.h"
#include "attention/kernels/metadata_launchers.h"
#include "attention/kernels/paged_decode_args.h"
#include "attention/kernels/paged_decode_launcher.h"
#include "attention/kernels/staged_uploads.h"
#include "attention/kernels/varlen_attention_args.h"
#include "attention/kernels/varlen_attention_launcher.h"
#include "sim/padded_rows.h"

namespace attnmeta {
namespace {

class GpuReplayBackend : public ReplayBackend {
 public:
  ~GpuReplayBackend() override {
    writer_.reset();
    for (DeviceBuffer* b : {&table_, &k_, &v_, &q_, &out_, &lse_, &partial_out_, &partial_lse_}) {
      if (b->ptr != nullptr) memory_->Free(*b);
    }
    word_.reset();
    memory_.reset();
    uploads_.reset();
    if (stream_ != nullptr) (void)hipStreamDestroy(stream_);
  }

  static absl::StatusOr<std::unique_ptr<ReplayBackend>> Create(const ReqToTokenPool& table,
                                                               TokenCount pool_slots) {
    int devices = 0;
    if (const hipError_t err = hipGetDeviceCount(&devices); err != hipSuccess || devices == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("backend \"gpu\": no GPU is visible",
                       err != hipSuccess ? absl::StrCat(" (", hipGetErrorString(err), ")") : ""));
    }
    auto b = std::unique_ptr<GpuReplayBackend>(new GpuReplayBackend());
    if (const hipError_t err = hipStreamCreate(&b->stream_); err != hipSuccess) {
      return absl::InternalError(
          absl::StrCat("backend \"gpu\": cannot create a stream: ", hipGetErrorString(err)));
    }
    // The replay's staged inputs (and the small table copies) ride in the writer's launch.
    absl::StatusOr<std::unique_ptr<StagedUploads>> uploads = StagedUploads::Create(b->stream_);
    if (!uploads.ok()) return uploads.status();
    b->uploads_ = *std::move(uploads);
    b->memory_ = std::make_unique<HipDeviceMemory>(b->stream_, b->uploads_.get());
    const int64_t bytes = static_cast<int64_t>(table.table().size() * sizeof(TokenSlot));
    absl::StatusOr<DeviceBuffer> t = b->memory_->Allocate("req_to_token", bytes);
    if (!t.ok()) return t.status();
    b->table_ = *t;
    DeviceReqToToken device_table{
        DeviceSpan<const TokenSlot>(static_cast<const TokenSlot*>(b->table_.ptr),
                                    table.table().size()),
        table.max_context_len()};
    DeviceMetadataWriter::Options options;
    options.uploads = b->uploads_.get();
    absl::StatusOr<std::unique_ptr<DeviceMetadataWriter>> writer =
        DeviceMetadataWriter::Create(device_table, pool_slots, b->stream_, options);
    if (!writer.ok()) return writer.status();
    b->writer_ = *std::move(writer);
    absl::StatusOr<DeviceViolationWord> word = DeviceViolationWord::Create();
    if (!word.ok()) return word.status();
    b->word_.emplace(*std::move(word));
    return std::unique_ptr<ReplayBackend>(std::move(b));
  }

  DeviceMemory& memory() override { return *memory_; }
  MetadataWriter& writer() override { return *writer_; }
  absl::Status SyncReqToToken(const ReqToTokenPool& table) override {
    return memory_->CopyToDevice(table_, 0, table.table().data(),
                                 static_cast<int64_t>(table.table().size() * sizeof(TokenSlot)));
  }
  absl::Status CheckAfterReplay() override { return writer_->CheckViolations(); }

  bool AttendsReplays(const AttentionDims& dims) const override {
    return DecodeQueryHeadsPerBlock(KernelDims(dims), 0).ok();
  }

  absl::Status SyncKvPool(absl::Span<const float> k, absl::Span<const float> v) override {
    if (k.size() != v.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("K/V pools of ", k.size(), " and ", v.size(), " values"));
    }
    const auto upload = [&](absl::Span<const float> pool, const char* name, DeviceBuffer& to) {
      const std::vector<uint16_t> bits = Bf16Bits(pool);
      const int64_t bytes = static_cast<int64_t>(bits.size() * sizeof(uint16_t));
      if (absl::Status s = Reserve(to, name, bytes); !s.ok()) return s;
      return memory_->CopyToDevice(to, 0, bits.data(), bytes);
    };
    if (absl::Status s = upload(k, "attention K pool", k_); !s.ok()) return s;
    if (absl::Status s = upload(v, "attention V pool", v_); !s.ok()) return s;
    pool_values_ = static_cast<int64_t>(k.size());
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<ReplayAttentionOutput>> AttendReplay(
      const ReplayAttentionInputs& in) override {
    const DecodeAttentionDims dims = KernelDims(in.dims);
    const ForwardMetadataView& m = in.metadata;
    const int64_t bs = m.batch_size();
    const int64_t q_row = int64_t{dims.num_q_heads} * dims.head_dim;
    if (in.q.size() % q_row != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(in.q.size(), " query values are not whole rows of ", q_row));
    }
    const int64_t rows = static_cast<int64_t>(in.q.size()) / q_row;
    std::vector<ReplayAttentionOutput> outputs;
    if (bs == 0) return outputs;
    std::vector<std::pair<std::string, DecodeKv>> sources = {{"token-level", TokenLevel(m)}};
    if (m.page_table.rows() > 0) sources.emplace_back("page-table", PageTable(m, in.page_size));
    // One query row per sequence: the decode kernel. Otherwise (target-verify, draft-extend)
    // the varlen kernel, with the tree mask when the metadata has one.
    const bool decode = m.mode == ForwardMode::kDecode || m.mode == ForwardMode::kDraftDecode;
    if (decode && rows != bs) {
      return absl::InvalidArgumentError(
          absl::StrCat(ForwardModeName(m.mode), ": ", rows, " query rows for ", bs, " sequences"));
    }
    if (absl::Status s = UploadQuery(in.q, q_row, rows); !s.ok()) return s;
    for (const auto& [path, kv] : sources) {
      absl::StatusOr<ReplayAttentionOutput> out;
      if (decode) {
        PagedDecodeArgs a;
        a.kv = kv;
        out = Launch(PagedDecodeAttention, dims, a, rows);
      } else {
        VarlenAttentionArgs a;
        a.qo_indptr = DeviceSpan<const TokenOffset>(m.qo_indptr.data(), m.qo_indptr.size());
        a.max_q_len = m.max_q_len;
        a.kv = kv;
        if (m.custom_mask.layout != MaskLayout::kNone) {
          a.mask = VarlenMask{
              m.custom_mask.layout,
              DeviceSpan<const uint8_t>(m.custom_mask.mask.data(), m.custom_mask.mask.size()),
              DeviceSpan<const int64_t>(m.custom_mask.mask_indptr.data(),
                                        m.custom_mask.mask_indptr.size())};
        }
        out = Launch(VarlenAttention, dims, a, rows);
      }
      if (!out.ok()) {
        return absl::Status(out.status().code(), absl::StrCat(path, ": ", out.status().message()));
      }
      out->path = path;
      outputs.push_back(*std::move(out));
    }
    if (m.mode == ForwardMode::kDecode && in.split_kv.work_items > 0) {
      absl::StatusOr<ReplayAttentionOutput> out = SplitDecode(dims, in, rows);
      if (!out.ok()) {
        return absl::Status(out.status().code(),
                            absl::StrCat("split-KV: ", out.status().message()));
      }
      out->path = "split-KV";
      outputs.push_back(*std::move(out));
    }
    return outputs;
  }

 private:
  GpuReplayBackend() = default;

  static DecodeAttentionDims KernelDims(const AttentionDims& d) {
    return DecodeAttentionDims{d.num_q_heads, d.num_kv_heads, d.head_dim, KvElementType::kBf16,
                               1.0f / std::sqrt(static_cast<float>(d.head_dim))};
  }

  static std::vector<uint16_t> Bf16Bits(absl::Span<const float> values) {
    std::vector<uint16_t> bits(values.size());
    for (size_t i = 0; i < values.size(); ++i) bits[i] = FloatToBf16(values[i]);
    return bits;
  }

  static DecodeKv TokenLevel(const ForwardMetadataView& m) {
    return DecodeTokenLevelKv{
        DeviceSpan<const TokenOffset>(m.kv_indptr.data(), m.kv_indptr.size()),
        DeviceSpan<const TokenSlot>(m.kv_indices.data(), m.kv_indices.size())};
  }

  static DecodeKv PageTable(const ForwardMetadataView& m, PageSize page_size) {
    return DecodePageTableKv{
        DeviceSpan<const PageId>(m.page_table.entries().data(), m.page_table.entries().size()),
        m.page_table.cols(), DeviceSpan<const TokenLength>(m.kv_lens.data(), m.kv_lens.size()),
        page_size};
  }

  // Makes `b` at least `bytes` long (its contents are not kept).
  absl::Status Reserve(DeviceBuffer& b, const char* name, int64_t bytes) {
    if (b.ptr != nullptr && b.bytes >= bytes) return absl::OkStatus();
    if (b.ptr != nullptr) memory_->Free(b);
    b = DeviceBuffer{};
    absl::StatusOr<DeviceBuffer> got = memory_->Allocate(name, bytes);
    if (!got.ok()) return got.status();
    b = *got;
    return absl::OkStatus();
  }

  // q_ holds the `rows` query rows of `q` in bf16, then zero rows up to `launch_rows` (a
  // bucket's padded rows, whose outputs are not compared).
  absl::Status UploadQuery(absl::Span<const float> q, int64_t q_row, int64_t launch_rows) {
    std::vector<uint16_t> bits = Bf16Bits(q);
    bits.resize(launch_rows * q_row, 0);
    const int64_t bytes = static_cast<int64_t>(bits.size() * sizeof(uint16_t));
    if (absl::Status s = Reserve(q_, "attention q", bytes); !s.ok()) return s;
    return memory_->CopyToDevice(q_, 0, bits.data(), bytes);
  }

  // Points the launch's pools, q and outputs at this backend's buffers (outputs poisoned with
  // NaN, so that a row the kernel does not write fails the comparison).
  absl::Status PrepareOutputs(const DecodeAttentionDims& dims, int64_t launch_rows,
                              DeviceSpan<const uint8_t>& q, DeviceSpan<const uint8_t>& k_pool,
                              DeviceSpan<const uint8_t>& v_pool, DeviceSpan<uint8_t>& out,
                              DeviceSpan<float>& lse) {
    const int64_t q_bytes = launch_rows * dims.num_q_heads * dims.head_dim * 2;
    const int64_t lse_bytes = launch_rows * dims.num_q_heads * static_cast<int64_t>(sizeof(float));
    if (absl::Status s = Reserve(out_, "attention out", q_bytes); !s.ok()) return s;
    if (absl::Status s = Reserve(lse_, "attention lse", lse_bytes); !s.ok()) return s;
    // Poisoned here rather than by memory_->Fill, which would also flush the staged q below
    // and hide a missing flush.
    for (const auto& [ptr, bytes] :
         {std::make_pair(out_.ptr, q_bytes), std::make_pair(lse_.ptr, lse_bytes)}) {
      if (const hipError_t err = hipMemsetAsync(ptr, 0xff, static_cast<size_t>(bytes), stream_);
          err != hipSuccess) {
        return absl::InternalError(
            absl::StrCat("attention outputs: poisoning failed: ", hipGetErrorString(err)));
      }
    }
    const size_t pool_bytes = static_cast<size_t>(pool_values_) * 2;
    q = DeviceSpan<const uint8_t>(static_cast<const uint8_t*>(q_.ptr),
                                  static_cast<size_t>(q_bytes));
    k_pool = DeviceSpan<const uint8_t>(static_cast<const uint8_t*>(k_.ptr), pool_bytes);
    v_pool = DeviceSpan<const uint8_t>(static_cast<const uint8_t*>(v_.ptr), pool_bytes);
    out = DeviceSpan<uint8_t>(static_cast<uint8_t*>(out_.ptr), static_cast<size_t>(q_bytes));
    lse = DeviceSpan<float>(static_cast<float*>(lse_.ptr),
                            static_cast<size_t>(launch_rows * dims.num_q_heads));
    // The metadata writer holds the staged uploads, so small copies (q) wait there for its
    // next launch: they go now, ahead of the kernel that reads them.
    if (absl::Status s = uploads_->Flush(); !s.ok()) return s;
    return word_->Reset(stream_);
  }

  // After a launch that returned `launched`: the first `rows` rows of out (as floats) and of
  // lse, once the violation word is clean.
  absl::StatusOr<ReplayAttentionOutput> Finish(const DecodeAttentionDims& dims,
                                               absl::Status launched, int64_t rows) {
    if (!launched.ok()) return launched;
    if (absl::Status s = word_->Check(stream_); !s.ok()) return s;
    std::vector<uint16_t> bits(static_cast<size_t>(rows * dims.num_q_heads * dims.head_dim));
    if (absl::Status s = memory_->CopyToHost(bits.data(), out_, 0,
                                             static_cast<int64_t>(bits.size() * sizeof(uint16_t)));
        !s.ok()) {
      return s;
    }
    ReplayAttentionOutput o;
    o.out.resize(bits.size());
    for (size_t i = 0; i < bits.size(); ++i) o.out[i] = Bf16ToFloat(bits[i]);
    o.lse.resize(static_cast<size_t>(rows * dims.num_q_heads));
    if (absl::Status s = memory_->CopyToHost(o.lse.data(), lse_, 0,
                                             static_cast<int64_t>(o.lse.size() * sizeof(float)));
        !s.ok()) {
      return s;
    }
    return o;
  }

  // `launch` (PagedDecodeAttention or VarlenAttention) of `a` over this backend's pools, q
  // and poisoned outputs for `launch_rows` query rows; out's rows as floats, and lse.
  template <typename Args>
  absl::StatusOr<ReplayAttentionOutput> Launch(
      absl::Status (*launch)(const Args&, kernels::DeviceViolation*, hipStream_t),
      const DecodeAttentionDims& dims, Args a, int64_t launch_rows) {
    a.dims = dims;
    if (absl::Status s = PrepareOutputs(dims, launch_rows, a.q, a.k_pool, a.v_pool, a.out, a.lse);
        !s.ok()) {
      return s;
    }
    return Finish(dims, launch(a, word_->device(), stream_), launch_rows);
  }

  // The decode kernel over the whole bucket (the plan covers its padded rows too), the
  // partials merged by a second launch; the real rows' outputs.
  absl::StatusOr<ReplayAttentionOutput> SplitDecode(const DecodeAttentionDims& dims,
                                                    const ReplayAttentionInputs& in, int64_t rows) {
    const ForwardMetadataView& p = in.padded;
    const int64_t bucket = p.batch_size();
    const int64_t q_row = int64_t{dims.num_q_heads} * dims.head_dim;
    if (absl::Status s = UploadQuery(in.q, q_row, bucket); !s.ok()) return s;
    const int64_t capacity = static_cast<int64_t>(in.split_buffers.work.size());
    const int64_t partial_bytes = capacity * q_row * static_cast<int64_t>(sizeof(float));
    const int64_t partial_lse_bytes =
        capacity * dims.num_q_heads * static_cast<int64_t>(sizeof(float));
    if (absl::Status s = Reserve(partial_out_, "attention partial out", partial_bytes); !s.ok()) {
      return s;
    }
    if (absl::Status s = Reserve(partial_lse_, "attention partial lse", partial_lse_bytes);
        !s.ok()) {
      return s;
    }
    // Poisoned (NaN) too, so that a partial the plan's items do not write spoils its merge.
    for (const auto& [ptr, bytes] : {std::make_pair(partial_out_.ptr, partial_bytes),
                                     std::make_pair(partial_lse_.ptr, partial_lse_bytes)}) {
      if (const hipError_t err = hipMemsetAsync(ptr, 0xff, static_cast<size_t>(bytes), stream_);
          err != hipSuccess) {
        return absl::InternalError(
            absl::StrCat("split-KV partials: poisoning failed: ", hipGetErrorString(err)));
      }
    }
    PagedDecodeArgs a;
    if (in.split_layout.paged()) {
      if (p.page_table.rows() == 0) {
        return absl::FailedPreconditionError("a paged split-KV plan with no page table to read");
      }
      a.kv = PageTable(p, in.page_size);
    } else {
      a.kv = TokenLevel(p);
    }
    a.split = DecodeSplitKv{DeviceSplitKvPlan{in.split_layout, in.split_kv},
                            DeviceSpan<const SplitKvWorkItem>(in.split_buffers.work.data(),
                                                              in.split_buffers.work.size()),
                            DeviceSpan<const SplitKvReduceItem>(in.split_buffers.reduce.data(),
                                                                in.split_buffers.reduce.size()),
                            DeviceSpan<float>(static_cast<float*>(partial_out_.ptr),
                                              static_cast<size_t>(capacity * q_row)),
                            DeviceSpan<float>(static_cast<float*>(partial_lse_.ptr),
                                              static_cast<size_t>(capacity * dims.num_q_heads)),
                            DeviceSpan<uint32_t>()};
    absl::StatusOr<ReplayAttentionOutput> out = Launch(PagedDecodeAttention, dims, a, bucket);
    if (!out.ok()) return out;
    if (absl::Status s = TrimPaddedRows(rows, q_row, dims.num_q_heads, &out->out, &out->lse);
        !s.ok()) {
      return s;
    }
    return out;
  }

  hipStream_t stream_ = nullptr;
  std::unique_ptr<StagedUploads> uploads_;
  std::unique_ptr<HipDeviceMemory> memory_;
  DeviceBuffer table_;
  std::unique_ptr<DeviceMetadataWriter> writer_;
  // The attention kernels' inputs and outputs, grown as forwards need.
  std::optional<DeviceViolationWord> word_;
  DeviceBuffer k_, v_;  // [slots][num_kv_heads][head_dim] bf16
  int64_t pool_values_ = 0;
  DeviceBuffer q_;                          // [rows][num_q_heads][head_dim] bf16
  DeviceBuffer out_;                        // like q_
  DeviceBuffer lse_;                        // [rows][num_q_heads] float
  DeviceBuffer partial_out_, partial_lse_;  // a split plan's partials, float
};

}  // namespace

absl::StatusOr<std::unique_ptr<ReplayBackend>> MakeGpuReplayBackend(const ReqToTokenPool& table,
                                                                    TokenCount pool_slots) {
  return GpuReplayBackend::Create(table, pool_slots);
}

}  // namespace attnmeta
