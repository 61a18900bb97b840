// Choosing the MultiChannel bootstrap (include/rdmachan/bootstrap.hpp).
#include "rdmachan/bootstrap.hpp"


#include "handshake/pmix_bootstrap.hpp"
#include "rdmachan/error.hpp"

namespace rdmachan {

const char* to_string(Bootstrap bootstrap) {
    switch (bootstrap) {
        case Bootstrap::automatic: return "auto";
        case Bootstrap::tcp: return "tcp";
        case Bootstrap::pmix: return "pmix";
        case Bootstrap::etcd: return "etcd";
    }
    return "unknown";
}

Bootstrap parse_bootstrap(std::string_view text, std::string_view source) {
    if (text == "auto") return Bootstrap::automatic;
    if (text == "tcp") return Bootstrap::tcp;
    if (text == "pmix") return Bootstrap::pmix;
    if (text == "etcd") return Bootstrap::etcd;
    throw Error(std::string(source) + "='" + std::string(text) + "' is not a bootstrap: use auto, tcp, pmix or etcd");
}

bool pmix_available() {
#ifdef RDMACHAN_HAVE_PMIX
    return true;
#else
    return false;
#endif
}

bool started_by_pmix_launcher(const EnvironmentLookup& getenv) {
    for (const char* name : {"PMIX_RANK", "PMIX_NAMESPACE", "PMIX_SERVER_URI", "PMIX_SERVER_URI2", "PMIX_SERVER_URI21",
                             "PMIX_SERVER_URI3", "PMIX_SERVER_URI4", "PMIX_SERVER_URI41"}) {
        const char* value = getenv(name);
        if (value != nullptr && *value != '\0') return true;
    }
    return false;
}

namespace {

BootstrapChoice require_pmix(std::string reason) {
    if (!pmix_available()) {
        throw Error("the PMIx bootstrap (" + reason +
                    ") is unavailable: rdmachan was built without PMIx; install Debian's libpmix-dev and rebuild, "
                    "or use the TCP rendezvous (RDMACHAN_BOOTSTRAP=tcp)");
    }
    return {Bootstrap::pmix, std::move(reason), true};
}

}  // namespace

BootstrapChoice choose_bootstrap(Bootstrap requested, const EnvironmentLookup& getenv) {
    // Checked even when the builder's explicit choice makes it moot: a typo never goes unseen.
    Bootstrap from_environment = Bootstrap::automatic;
    const char* text = getenv("RDMACHAN_BOOTSTRAP");
    const bool environment_set = text != nullptr && *text != '\0';
    if (environment_set) from_environment = parse_bootstrap(text, "RDMACHAN_BOOTSTRAP");

    if (requested == Bootstrap::tcp) return {Bootstrap::tcp, "MultiChannelBuilder::bootstrap(tcp)", true};
    if (requested == Bootstrap::pmix) return require_pmix("MultiChannelBuilder::bootstrap(pmix)");
    if (requested == Bootstrap::etcd) return {Bootstrap::etcd, "MultiChannelBuilder::bootstrap(etcd)", true};
    if (from_environment == Bootstrap::tcp) return {Bootstrap::tcp, "RDMACHAN_BOOTSTRAP=tcp", true};
    if (from_environment == Bootstrap::pmix) return require_pmix("RDMACHAN_BOOTSTRAP=pmix");
    if (from_environment == Bootstrap::etcd) return {Bootstrap::etcd, "RDMACHAN_BOOTSTRAP=etcd", true};
    if (pmix_available() && started_by_pmix_launcher(getenv)) {
        return {Bootstrap::pmix, "automatic: started by a PMIx launcher", false};
    }
    return {Bootstrap::tcp,
            started_by_pmix_launcher(getenv) ? "automatic: started by a PMIx launcher, but built without PMIx"
                                             : "automatic: no PMIx launcher",
            false};
}

}  // namespace rdmachan
