// Pieces of the rendezvous protocol shared by server and client: proof labels and wording.
#pragma once

#include <cstdint>

#include "handshake/authentication.hpp"
#include <string>
#include <vector>

namespace rdmachan::handshake {

inline constexpr const char* rendezvous_client_label = "rdmachan rendezvous client v1";
inline constexpr const char* rendezvous_server_label = "rdmachan rendezvous server v1";

// The rendezvous proof over job, rank, session and both nonces; with peer replacement its role
// ("watch" or "replace", empty without) is proven too.
inline std::string rendezvous_proof(std::string_view token, std::string_view label, std::string_view job,
                                    std::string_view rank, std::string_view session,
                                    std::string_view client_nonce, std::string_view server_nonce,
                                    std::string_view role) {
    if (role.empty()) return make_proof(token, label, {job, rank, session, client_nonce, server_nonce});
    return make_proof(token, label, {job, rank, session, client_nonce, server_nonce, role});
}

// "3, 5-9, 12": ranks listed compactly for error messages.
std::string format_ranks(const std::vector<std::uint32_t>& ranks);

}  // namespace rdmachan::handshake
