// Test fixture: a SoftEndpoint in the parent connected with one in a forked child
// (tests/soft/child_process.hpp), through the pipes: the child sends its address, the parent
// answers with its own, both connect, and the child says "ready" once it has posted what the
// test needs.
#pragma once

#include "tests/soft/child_process.hpp"
#include "tests/soft/soft_endpoint.hpp"

namespace rdmachan::test {

// In the child: false if the parent is gone (the child then _exits with its set-up code).
inline bool connect_to_parent(SoftEndpoint& endpoint, int from_parent, int to_parent) {
    const Address mine = endpoint.address();
    Address parent{};
    if (!write_all(to_parent, &mine, sizeof mine) || !read_all(from_parent, &parent, sizeof parent)) return false;
    endpoint.connect(parent);
    return true;
}

inline bool tell_parent_ready(int to_parent) {
    const char ready = 'r';
    return write_all(to_parent, &ready, 1);
}

// In the parent: returns the child's address once the child is ready.
inline Address connect_to_child(ChildProcess& child, SoftEndpoint& endpoint) {
    const Address remote = child.receive<Address>("its endpoint's address");
    child.send(endpoint.address(), "this endpoint's address");
    endpoint.connect(remote);
    child.receive<char>("'ready'");
    return remote;
}

}  // namespace rdmachan::test
