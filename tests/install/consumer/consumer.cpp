#include <rdmachan/version.hpp>

#include <cstdio>
#include <cstring>

int main() {
    const char* version = rdmachan::version();
    std::printf("rdmachan %s\n", version);
    return std::strlen(version) > 0 ? 0 : 1;
}
