// What UCX and the process say about themselves, as text for the UCX
// transport's logs, messages and tests (ucx_transport.cc): the transports a
// context offers, the lanes an endpoint uses, and what memory backs an
// address. Pure reads; thread-safe except where UCX's own calls are not.
#pragma once

#include <ucp/api/ucp.h>

#include <cstdio>
#include <functional>
#include <string>

namespace strata::disagg {

// What `print` writes to a FILE*, as a string ("" when no memory stream).
std::string CaptureToString(const std::function<void(FILE*)>& print);

// This host's name, "?" when unknown.
std::string Hostname();

// "tcp/lo posix/memory ..." from ucp_context_print_info's resource lines:
// what the context offers.
std::string ResourcesOf(ucp_context_h context);

// "sysv/memory posix/memory" from ucp_ep_print_info's lane lines: what an
// endpoint uses, each transport once.
std::string LanesOf(const std::string& ep_info);

// What backs the mapping that holds `p`, from /proc/self/maps: "sysv shared
// memory", "posix shared memory", "heap", "private memory", the mapped
// file's path, or "unknown memory".
std::string MemoryKindAt(const void* p);

}  // namespace strata::disagg
