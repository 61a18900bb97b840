// Pieces of the rendezvous protocol shared by server and client: proof labels and wording.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace rdmachan::handshake {

inline constexpr const char* rendezvous_client_label = "rdmachan rendezvous client v1";
inline constexpr const char* rendezvous_server_label = "rdmachan rendezvous server v1";

// "3, 5-9, 12": ranks listed compactly for error messages.
std::string format_ranks(const std::vector<std::uint32_t>& ranks);

}  // namespace rdmachan::handshake
