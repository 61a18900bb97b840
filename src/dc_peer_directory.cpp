#include "src/dc_peer_directory.hpp"

#include "rdmachan/error.hpp"

namespace rdmachan::detail {

std::shared_ptr<const DcPeerDirectory> DcPeerDirectory::from_endpoints(const std::vector<Endpoint>& table,
                                                                       const std::string& me) {
    std::vector<handshake::DirectoryEntry> entries;
    entries.reserve(table.size());
    for (const Endpoint& endpoint : table) entries.push_back(handshake::directory_entry(endpoint));
    auto directory = std::make_shared<DcPeerDirectory>();
    directory->owned_ = handshake::encode_directory(entries, {});
    directory->owned_.shrink_to_fit();
    directory->view_ = handshake::DirectoryView(directory->owned_, static_cast<std::uint32_t>(table.size()), 0);
    directory->check(me);
    return directory;
}

std::shared_ptr<const DcPeerDirectory> DcPeerDirectory::from_bytes(std::string_view bytes, std::size_t table_size,
                                                                   std::shared_ptr<const void> owner,
                                                                   std::uint32_t world, const std::string& me) {
    auto directory = std::make_shared<DcPeerDirectory>();
    directory->owner_ = std::move(owner);
    try {
        directory->view_ = handshake::DirectoryView(bytes, world, table_size);
    } catch (const Error& error) {
        throw Error(me + ": " + error.what());
    }
    directory->check(me);
    return directory;
}

void DcPeerDirectory::check(const std::string& me) const {
    for (std::uint32_t rank = 0; rank < view_.size(); ++rank) {
        const DcPeerRecord record = view_.record(rank);
        if (!record.has_target) {
            throw Error(me + ": rank " + std::to_string(rank) +
                        " has no DC target (endpoint field 'dc' is empty): it is not in DC mode, this process is");
        }
        // A receive names the initiator that sent it: without them, no receive could be told to
        // come from this rank.
        if (!record.has_initiators) {
            throw Error(me + ": rank " + std::to_string(rank) + " published no DC initiators (endpoint field 'dci' is empty)");
        }
    }
    if (const std::optional<handshake::DirectoryView::Collision> collision = view_.first_collision()) {
        throw Error(me + ": " + handshake::DirectoryView::describe(*collision));
    }
}

}  // namespace rdmachan::detail
