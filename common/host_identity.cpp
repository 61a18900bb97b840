#include "common/host_identity.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

namespace rdmachan::detail {
namespace {

std::uint64_t namespace_inode(const char* path) {
    struct stat status{};
    return ::stat(path, &status) == 0 ? static_cast<std::uint64_t>(status.st_ino) : 0;
}

// The boot id is a UUID in text ("8a1f...-..."): its 32 hex digits as 16 bytes.
std::array<std::uint8_t, 16> read_boot_id() {
    std::array<std::uint8_t, 16> id{};
    std::ifstream file("/proc/sys/kernel/random/boot_id");
    std::string text;
    std::getline(file, text);
    std::size_t byte = 0;
    int half = 0;
    for (char c : text) {
        int value = -1;
        if (c >= '0' && c <= '9') value = c - '0';
        else if (c >= 'a' && c <= 'f') value = c - 'a' + 10;
        if (value < 0 || byte == id.size()) continue;
        id[byte] = static_cast<std::uint8_t>(id[byte] << 4 | value);
        if (++half == 2) {
            half = 0;
            ++byte;
        }
    }
    return id;
}

}  // namespace

HostIdentity this_host_identity() {
    static const HostIdentity fixed = [] {
        HostIdentity identity;
        identity.boot_id = read_boot_id();
        identity.network_namespace = namespace_inode("/proc/self/ns/net");
        identity.pid_namespace = namespace_inode("/proc/self/ns/pid");
        return identity;
    }();
    HostIdentity identity = fixed;
    identity.uid = static_cast<std::uint32_t>(::getuid());
    identity.pid = static_cast<std::uint32_t>(::getpid());
    return identity;
}

const char* different_host_reason(const HostIdentity& mine, const HostIdentity& peer) {
    if (mine.boot_id != peer.boot_id) return "its boot id differs (another host or another boot)";
    if (mine.uid != peer.uid) return "it runs as another user";
    if (mine.network_namespace != peer.network_namespace) return "it is in another network namespace";
    if (mine.pid_namespace != peer.pid_namespace) return "it is in another PID namespace";
    return nullptr;
}

std::string host_key(const HostIdentity& identity) {
    std::string key;
    key.reserve(72);
    char digits[17];
    for (std::uint8_t byte : identity.boot_id) {
        std::snprintf(digits, sizeof digits, "%02x", byte);
        key += digits;
    }
    std::snprintf(digits, sizeof digits, "%08x", identity.uid);
    key += digits;
    std::snprintf(digits, sizeof digits, "%016llx", static_cast<unsigned long long>(identity.network_namespace));
    key += digits;
    std::snprintf(digits, sizeof digits, "%016llx", static_cast<unsigned long long>(identity.pid_namespace));
    key += digits;
    return key;
}

}  // namespace rdmachan::detail
