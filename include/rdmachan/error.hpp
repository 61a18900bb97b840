// Errors. The control plane (build, register, handshake) throws rdmachan::Error with a message
// that names the call, the value and the object. The data path never throws: an operation's
// outcome is a WorkResult whose error names the operation, the peer and the status in words.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace rdmachan {

class Error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

enum class Operation : std::uint8_t {
    send,
    send_with_immediate,
    receive,
    rdma_write,
    rdma_write_with_immediate,
    rdma_read,
    atomic_fetch_and_add,
    atomic_compare_and_swap,
    batch,  // several operations under one doorbell (WorkBatch)
};

const char* to_string(Operation operation);

// Why an operation failed: the verbs status (ibv_wc_status numbering) and, where the device
// gave them, the mlx5 syndrome and vendor syndrome.
struct WorkError {
    Operation operation = Operation::send;
    std::uint8_t status = 0;
    std::uint8_t syndrome = 0;
    std::uint8_t vendor_syndrome = 0;
    bool deadline_expired = false;  // no completion before the wait's deadline
    // The wait for it was cancelled (rdmachan/asio.hpp); the operation itself stays posted until
    // its completion, as work on a NIC cannot be taken back.
    bool cancelled = false;
    const char* not_posted = nullptr;  // why the device refused to take it (nothing was posted)
    std::string peer;

    // e.g. "rdma_write to peer soft:127.0.0.1:4711 qpn 261 failed: remote access error (status 10, syndrome 0x13)"
    std::string message() const;
};

}  // namespace rdmachan
