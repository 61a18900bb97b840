// How a MultiChannel finds its peers before any queue pair connects: the TCP rendezvous
// (rendezvous.hpp); PMIx, for jobs started by a launcher that provides it (Open MPI's mpirun,
// Slurm with --mpi=pmix, PRRTE); or etcd, for services whose members join and leave while they
// run (membership.hpp, PreparedMultiChannel::join). Under PMIx the endpoints travel through the
// launcher (PMIx_Put/Commit, a fence, PMIx_Get): no server, no open port, no job token (the
// launcher authenticates the job), and rank and world size come from PMIx too.
//
// Choice, highest first: an explicit MultiChannelBuilder::bootstrap(tcp | pmix | etcd); then
// RDMACHAN_BOOTSTRAP=auto|tcp|pmix|etcd; then automatic (never etcd, which must be asked for):
// PMIx when this process was started by a PMIx
// launcher (PMIX_RANK, PMIX_NAMESPACE or PMIX_SERVER_URI* set) and the library was built with
// PMIx, else the TCP rendezvous. The explicit setting wins as explicit arguments win over
// RDMACHAN_* in launcher_environment.hpp; RDMACHAN_BOOTSTRAP is still checked, so a misspelt value
// is an error whatever the setting.
#pragma once

#include <string>
#include <string_view>

#include "rdmachan/launcher_environment.hpp"

namespace rdmachan {

// etcd: membership that changes while running (membership.hpp); never chosen automatically.
enum class Bootstrap { automatic, tcp, pmix, etcd };

const char* to_string(Bootstrap bootstrap);  // "auto", "tcp", "pmix", "etcd"

// "auto" | "tcp" | "pmix" | "etcd". Throws rdmachan::Error naming `source` (e.g. the variable) and the text.
Bootstrap parse_bootstrap(std::string_view text, std::string_view source);

// Whether this library was built with PMIx (Debian's libpmix-dev).
bool pmix_available();

// Whether the environment says a PMIx launcher started this process.
bool started_by_pmix_launcher(const EnvironmentLookup& getenv = ::getenv);

struct BootstrapChoice {
    Bootstrap bootstrap = Bootstrap::tcp;  // tcp, pmix or etcd, never automatic
    std::string reason;                    // e.g. "RDMACHAN_BOOTSTRAP=pmix", for error messages
    bool explicit_choice = false;          // false when automatic detection chose it
};

// Resolves `requested` as described above. Throws rdmachan::Error when PMIx is asked for and the
// library was built without it (naming the package libpmix-dev), and on a bad RDMACHAN_BOOTSTRAP.
BootstrapChoice choose_bootstrap(Bootstrap requested, const EnvironmentLookup& getenv = ::getenv);

}  // namespace rdmachan
