#include "disagg/kv_transport.h"

#include <array>
#include <condition_variable>
#include <mutex>
#include <optional>

#include "disagg/ucx_transport.h"

namespace strata::disagg {

StatusOr<std::unique_ptr<KvTransport>> CreateKvTransport(const TransportOptions& options) {
  if (options.backend == "ucx") {
    ASSIGN_OR_RETURN(std::unique_ptr<UcxTransport> t, UcxTransport::Create());
    return std::unique_ptr<KvTransport>(std::move(t));
  }
  return InvalidArgument("--disaggregation-transfer-backend \"" + options.backend +
                         "\" is not a KV transfer backend; known: ucx");
}

namespace {

class TransportPoolAllocator final : public KvPoolAllocator {
 public:
  explicit TransportPoolAllocator(std::shared_ptr<KvTransport> transport)
      : transport_(std::move(transport)) {}

  StatusOr<KvPoolBlock> Allocate(int /*group*/, size_t bytes) override {
    ASSIGN_OR_RETURN(const KvTransport::AllocatedRegion r, transport_->AllocateRegion(bytes));
    if (memory_.empty()) memory_ = transport_->RegionMemory(r.id);
    // The owner frees the region, and holds the transport until then.
    std::shared_ptr<KvTransport> t = transport_;
    std::shared_ptr<void> owner(r.base, [t, id = r.id](void*) { t->FreeRegion(id); });
    return KvPoolBlock{r.base, r.length, std::move(owner)};
  }

  std::string Describe() const override {
    return transport_->name() + " transport" + (memory_.empty() ? "" : " (" + memory_ + ")");
  }

 private:
  std::shared_ptr<KvTransport> transport_;
  std::string memory_;
};

}  // namespace

std::shared_ptr<KvPoolAllocator> MakeKvPoolAllocator(std::shared_ptr<KvTransport> transport) {
  return std::make_shared<TransportPoolAllocator>(std::move(transport));
}

Status SelfTestKvTransport(const TransportOptions& options, std::chrono::milliseconds timeout) {
  // The buffers outlive both transports (declared first, destroyed last).
  std::array<char, 64> src{}, dst{};
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<char>(i * 7 + 1);
  auto step = [](const char* what, const Status& s) { return s.Annotate(what); };
  auto receiver = CreateKvTransport(options);
  if (!receiver.ok()) return step("initialising the transport", receiver.status());
  auto sender = CreateKvTransport(options);
  if (!sender.ok()) return step("initialising the transport", sender.status());
  auto rr = (*receiver)->RegisterRegion(dst.data(), dst.size());
  if (!rr.ok()) return step("registering memory", rr.status());
  auto sr = (*sender)->RegisterRegion(src.data(), src.size());
  if (!sr.ok()) return step("registering memory", sr.status());
  auto desc = (*receiver)->LocalDescriptor();
  if (!desc.ok()) return step("exporting the descriptor", desc.status());
  auto peer = (*sender)->Connect(*desc);
  if (!peer.ok()) return step("connecting to a peer on this host", peer.status());

  std::mutex mu;
  std::condition_variable cv;
  std::optional<Status> result;
  const WriteOp op{*sr, 0, *rr, 0, src.size()};
  Status posted = (*sender)->Write(*peer, std::span<const WriteOp>(&op, 1), [&](Status s) {
    std::lock_guard lock(mu);
    result = std::move(s);
    cv.notify_all();
  });
  if (!posted.ok()) {
    (*sender)->Disconnect(*peer);
    return step("writing to a peer on this host", posted);
  }
  bool done;
  {
    std::unique_lock lock(mu);
    done = cv.wait_for(lock, timeout, [&] { return result.has_value(); });
  }
  // Disconnect ends a write still in flight, so `done` has run once after it.
  (*sender)->Disconnect(*peer);
  if (!done)
    return Unavailable("writing to a peer on this host: no completion within " +
                       std::to_string(timeout.count()) + " ms");
  if (!result->ok()) return step("writing to a peer on this host", *result);
  if (src != dst)
    return Internal("writing to a peer on this host: the write completed but the bytes differ");
  return OkStatus();
}

}  // namespace strata::disagg
