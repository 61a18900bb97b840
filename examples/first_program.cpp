// A first program: two channels in one process, connected to each other, move bytes both ways
// RDMA offers: a one-sided write into the peer's memory, and a send into a receive the peer
// posted. Without an RDMA NIC it runs on the software mlx5 device. README.md shows this file.
#include <rdmachan/channel.hpp>

#include <cstdio>
#include <cstring>

int main() {
    // Build both ends. Each has a local endpoint (queue pair number, LID/GID, PSN, MTU) as JSON,
    // to be given to the other end any way you like (between processes: a socket, a file, or the
    // library's own TCP exchange, connect(); see README.md).
    rdmachan::PreparedChannel prepared_a = rdmachan::ChannelBuilder().build();
    rdmachan::PreparedChannel prepared_b = rdmachan::ChannelBuilder().build();
    const nlohmann::json endpoint_a = prepared_a.endpoint();
    const nlohmann::json endpoint_b = prepared_b.endpoint();
    rdmachan::Channel a = std::move(prepared_a).handshake(endpoint_b.get<rdmachan::ChannelEndpoint>());
    rdmachan::Channel b = std::move(prepared_b).handshake(endpoint_a.get<rdmachan::ChannelEndpoint>());

    rdmachan::MemoryRegion a_memory = a.allocate_memory(4096);
    rdmachan::MemoryRegion b_memory = b.allocate_memory(4096);
    const char message[] = "hello over RDMA";
    std::memcpy(a_memory.data(), message, sizeof message);

    // One-sided: A writes into B's memory; B's CPU takes no part.
    const rdmachan::WorkResult written = a.write(a_memory.slice(0, sizeof message), b_memory.remote().slice(0, sizeof message));
    if (!written) {
        std::fprintf(stderr, "write: %s\n", written.error().message().c_str());  // names the operation, peer and status
        return 1;
    }

    // Two-sided: B posts a receive, A sends into it with 32 bits of immediate data.
    rdmachan::PendingWork receive = b.post_receive(b_memory.slice(1024, 1024));
    const rdmachan::WorkResult sent = a.send(a_memory.slice(0, sizeof message), /*immediate=*/42u);
    const rdmachan::WorkResult received = receive.wait();
    if (!sent || !received) {
        std::fprintf(stderr, "send: %s\n", (!sent ? sent : received).error().message().c_str());
        return 1;
    }

    const auto* landed = static_cast<const char*>(b_memory.data());
    const bool ok = std::strcmp(landed, message) == 0 && std::strcmp(landed + 1024, message) == 0 &&
                    received.completion().immediate == 42u && received.completion().bytes == sizeof message;
    std::printf("first_program: written \"%s\", sent \"%s\" with immediate %u: %s\n", landed, landed + 1024,
                received.completion().immediate.value_or(0), ok ? "every byte as sent" : "WRONG");
    return ok ? 0 : 1;
}
