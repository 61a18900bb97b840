// An etcd for a local elastic run when RDMACHAN_ETCD names none: Debian's etcd-server binary
// on two free loopback ports with a temporary data directory, stopped (and the directory
// removed) when this object goes.
#pragma once

#include <sys/types.h>

#include <string>

namespace demo {

class LocalEtcd {
public:
    // Starts etcd and waits until its client port accepts connections (at most 20 s). Throws
    // std::runtime_error naming what is missing or what failed.
    LocalEtcd();
    ~LocalEtcd();
    LocalEtcd(const LocalEtcd&) = delete;
    LocalEtcd& operator=(const LocalEtcd&) = delete;
    const std::string& endpoint() const { return endpoint_; }

private:
    std::string directory_;
    std::string endpoint_;
    pid_t pid_ = -1;
};

}  // namespace demo
