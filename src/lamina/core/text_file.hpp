#pragma once
// Text inputs (decks, machine descriptions, a checkpoint directory's `latest`) read with a
// size cap: a path that is not a regular file (a FIFO, /dev/zero, a directory) or is larger
// than any such input can be is refused before it is read (InputError, exit 2), never read
// until memory runs out or blocked on.
#include <cstdint>
#include <string>

namespace lamina {

constexpr std::int64_t kMaxDeckBytes = std::int64_t{16} << 20;

// The whole content of `path`, `what` it is for the message ("deck").
std::string read_text_file(const std::string& path, const std::string& what, std::int64_t max_bytes);

}  // namespace lamina
