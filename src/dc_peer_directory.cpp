#include "src/dc_peer_directory.hpp"

#include <algorithm>

#include "rdmachan/error.hpp"

namespace rdmachan::detail {

std::shared_ptr<const DcPeerDirectory> DcPeerDirectory::from_endpoints(const std::vector<Endpoint>& table,
                                                                       const std::string& me) {
    auto directory = std::make_shared<DcPeerDirectory>();
    directory->records_.resize(table.size());
    std::size_t initiators = 0;
    for (const Endpoint& endpoint : table) initiators += endpoint.dci.size();
    directory->senders_.reserve(initiators);
    for (std::uint32_t rank = 0; rank < table.size(); ++rank) {
        const Endpoint& endpoint = table[rank];
        DcPeerRecord& record = directory->records_[rank];
        record.gid = endpoint.port.gid;
        record.lid = endpoint.port.lid;
        record.dctn = endpoint.dc.front().dctn;
        record.key = endpoint.dc.front().dc_key;
        record.device = endpoint.device;
        record.present = true;
        for (std::uint32_t initiator : endpoint.dci) {
            directory->senders_.push_back({dc_sender_key(endpoint.port.lid, initiator), rank});
        }
    }
    std::vector<DcSender>& senders = directory->senders_;
    std::sort(senders.begin(), senders.end(), [](const DcSender& left, const DcSender& right) {
        return left.key != right.key ? left.key < right.key : left.rank < right.rank;
    });
    for (std::size_t i = 1; i < senders.size(); ++i) {
        if (senders[i].key != senders[i - 1].key) continue;
        if (senders[i].rank == senders[i - 1].rank) {
            // One rank naming an initiator twice: its receives are still its own.
            continue;
        }
        throw Error(me + ": DC: rank " + std::to_string(senders[i - 1].rank) + " and rank " +
                    std::to_string(senders[i].rank) + " both publish DC initiator " +
                    std::to_string(static_cast<std::uint32_t>(senders[i].key)) + " on LID " +
                    std::to_string(senders[i].key >> 32) + ": their receives could not be told apart");
    }
    senders.erase(std::unique(senders.begin(), senders.end(),
                              [](const DcSender& left, const DcSender& right) { return left.key == right.key; }),
                  senders.end());
    senders.shrink_to_fit();
    return directory;
}

std::optional<std::uint32_t> DcPeerDirectory::sender(std::uint16_t lid, std::uint32_t initiator) const {
    const std::uint64_t key = dc_sender_key(lid, initiator);
    auto found = std::lower_bound(senders_.begin(), senders_.end(), key,
                                  [](const DcSender& entry, std::uint64_t wanted) { return entry.key < wanted; });
    if (found == senders_.end() || found->key != key) return std::nullopt;
    return found->rank;
}

}  // namespace rdmachan::detail
