// Turning a host and port into addresses to connect to, for the rendezvous client, the pairwise
// exchange and the etcd client.
#pragma once

#include <string>
#include <vector>

#include "handshake/asio.hpp"

namespace rdmachan::handshake {

// The addresses of `host` at `port`. A numeric address ("10.0.0.1", "::1", "fe80::1%eth0") with
// a numeric port is taken as it is; anything else goes through the system's resolver. Asio's
// resolver runs getaddrinfo on a thread of its own, started by the first resolve on each
// io_context, and each rank's client (and each etcd request) has its own io_context: with a
// numeric address, the usual case in a job, no such thread is started. Throws
// boost::system::system_error when the name does not resolve.
Task<std::vector<tcp::endpoint>> resolve(std::string host, std::string port);

}  // namespace rdmachan::handshake
