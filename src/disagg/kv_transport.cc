#include "disagg/kv_transport.h"

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

}  // namespace strata::disagg
