// What ranks compare at start-up: the resolved deck and the sizes of the data files, and
// the first line where two of them differ, with its section.
#include "lamina/train/deck_agreement.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace lamina::test {
namespace {

namespace fs = std::filesystem;

TEST(DeckAgreement, TheFirstDifferenceNamesItsSectionAndBothLines) {
  const std::string a = "[model]\nlayers = 2\n[optimizer]\nlr = 0.001\nbeta1 = 0.9\n";
  EXPECT_EQ(first_difference(a, a, 3), "");
  EXPECT_EQ(first_difference(a, "[model]\nlayers = 2\n[optimizer]\nlr = 0.002\nbeta1 = 0.8\n", 3),
            "[optimizer] `lr = 0.001` on rank 0, `lr = 0.002` on rank 3");
  EXPECT_EQ(first_difference(a, a + "extra = 1\n", 1), "[optimizer] `(nothing)` on rank 0, `extra = 1` on rank 1");
}

// A data file of another size on one node (a copy still being written, a stale one) is a
// difference even where the decks agree.
TEST(DeckAgreement, TheFingerprintHoldsTheDataFilesSizes) {
  const std::string dir = (fs::temp_directory_path() / ("lamina_agree_" + std::to_string(::getpid()))).string();
  fs::create_directories(dir);
  const std::string data = dir + "/tokens.txt";
  std::ofstream(data) << "some text to train on";
  const std::string deck = "[model]\nlayers = 1\nd_model = 8\nheads = 2\nseq_len = 4\nvocab_size = 256\n"
                           "[data]\nformat = \"text\"\npath = \"" + data + "\"\nbatch_size = 1\n[train]\nsteps = 1\n";
  const std::string before = deck_fingerprint(parse_deck(deck, "d.toml"));
  EXPECT_NE(before.find("data.path file " + data + ": 21 bytes\n"), std::string::npos) << before;
  std::ofstream(data, std::ios::app) << "!";
  const std::string after = deck_fingerprint(parse_deck(deck, "d.toml"));
  EXPECT_NE(first_difference(before, after, 1).find("21 bytes` on rank 0, `data.path file " + data + ": 22 bytes"),
            std::string::npos)
      << first_difference(before, after, 1);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace lamina::test
