// The descriptor UcxTransport::LocalDescriptor exports and Connect parses:
// what a peer needs to write into this process's registered regions (the
// UCX worker address, each region's base, length and packed remote key)
// plus the nonce the peer's answer to Connect's probe must hold, so that
// Connect knows it reached the process that wrote the descriptor.
// Pure functions on values; thread-safe. ParseUcxDescriptor is the only
// code that sees a peer's bytes before UCX does, so it is fuzzed
// (ucx_descriptor_test.cc).
//
// Wire format (little-endian), version 2 (version 1 had a probe region
// after the worker address: Connect read the nonce from it):
//   "STRATAKV" | u32 version | u32 body length | body | u64 FNV-1a of all before
//   body: u64 nonce | str label | str worker address | u32 n | n x region
//   region: u64 base | u64 length | str packed rkey;  str: u32 length | bytes
// The checksum makes truncated or corrupted descriptors fail here, before
// UCX parses an address or an rkey (UCX trusts those bytes). It is not a
// defence against a forged descriptor: the bootstrap network is trusted.

#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "util/status.h"

namespace strata::disagg {

struct UcxRemoteRegion {
  uint64_t base = 0;
  uint64_t length = 0;
  std::string rkey;  // ucp_rkey_pack output
};

struct UcxDescriptor {
  uint64_t nonce = 0;          // random per transport; its probe answer holds it
  std::string label;           // "host pid N", for messages
  std::string worker_address;  // ucp_worker_get_address output
  std::vector<UcxRemoteRegion> regions;
};

std::string EncodeUcxDescriptor(const UcxDescriptor& d);
// InvalidArgument saying what is wrong and at which byte, for anything that
// is not a descriptor of this version written by EncodeUcxDescriptor.
StatusOr<UcxDescriptor> ParseUcxDescriptor(std::string_view bytes);

}  // namespace strata::disagg
