// Machine descriptions: the shipped ones parse, mistakes are located, and a description
// written by `lamina bench machine --write` reads back the same.
#include "lamina/plan/machine.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <string>

#include "lamina/core/error.hpp"

namespace lamina::test {
namespace {

TEST(Machine, ShippedDescriptionsParse) {
  for (const char* f : {"dgx-a100-80gb.toml", "dgx-h100.toml", "dgx-a100-80gb-25gbe.toml"}) {
    const MachineSpec m = load_machine(std::string(LAMINA_SOURCE_DIR) + "/inputs/machines/" + f);
    EXPECT_EQ(m.devices_per_node, 8) << f;
    EXPECT_GT(m.peak_flops_bf16, m.peak_flops_fp32) << f;
    EXPECT_GE(m.device_memory, 80e9) << f;
    EXPECT_GT(m.intra_bandwidth, m.inter_bandwidth) << f;
  }
  const MachineSpec a100 = load_machine(std::string(LAMINA_SOURCE_DIR) + "/inputs/machines/dgx-a100-80gb.toml");
  EXPECT_DOUBLE_EQ(a100.peak_flops_bf16, 312e12);
  EXPECT_DOUBLE_EQ(a100.inter_bandwidth, 25e9);
}

TEST(Machine, MistakesAreLocated) {
  const std::string text = "name = \"x\"\n[device]\nper_node = 8\nmemroy = \"80GB\"\n";
  try {
    parse_machine(text, "m.toml");
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("m.toml:4:1: unknown key 'memroy' in device (did you mean 'memory'?)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("missing device.peak_tflops_fp32"), std::string::npos) << msg;
  }
}

// A bandwidth of 0 priced communication as free; sizes and rates are > 0.
TEST(Machine, ZeroBandwidthsAreMistakes) {
  std::ifstream in(std::string(LAMINA_SOURCE_DIR) + "/inputs/machines/dgx-h100.toml");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string key = "inter_node_bandwidth = ";
  const std::size_t at = text.find(key);
  ASSERT_NE(at, std::string::npos);
  text.replace(at + key.size(), text.find('\n', at) - at - key.size(), "0");
  try {
    parse_machine(text, "m.toml");
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("network.inter_node_bandwidth must be a byte count > 0"), std::string::npos)
        << e.what();
  }
}

TEST(Machine, WrittenDescriptionsReadBack) {
  MachineSpec m = load_machine(std::string(LAMINA_SOURCE_DIR) + "/inputs/machines/dgx-h100.toml");
  m.device_adamw_rate = 1.5e10;
  const MachineSpec again = parse_machine(machine_toml(m), "<written>");
  EXPECT_EQ(again.name, m.name);
  EXPECT_NEAR(again.peak_flops_bf16, m.peak_flops_bf16, 1e-5 * m.peak_flops_bf16);
  EXPECT_NEAR(again.inter_bandwidth, m.inter_bandwidth, 1e-5 * m.inter_bandwidth);
  EXPECT_NEAR(again.device_adamw_rate, m.device_adamw_rate, 1e-5 * m.device_adamw_rate);
  EXPECT_EQ(again.devices_per_node, m.devices_per_node);
}

}  // namespace
}  // namespace lamina::test
