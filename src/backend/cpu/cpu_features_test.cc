#include "backend/cpu/cpu_features.h"

#include <fstream>
#include <string>

#include <gtest/gtest.h>

namespace strata::cpu {
namespace {

TEST(ResolveCpuIsaTest, AutoPicksTheBestLevel) {
  CpuFeatures none, avx2, avx512;
  avx2.avx2 = true;
  avx512.avx2 = avx512.avx512 = true;
  EXPECT_EQ(*ResolveCpuIsa("auto", none), CpuIsa::kScalar);
  EXPECT_EQ(*ResolveCpuIsa("auto", avx2), CpuIsa::kAvx2);
  EXPECT_EQ(*ResolveCpuIsa("auto", avx512), CpuIsa::kAvx512);
  EXPECT_EQ(*ResolveCpuIsa("avx2", avx512), CpuIsa::kAvx2);
  EXPECT_EQ(*ResolveCpuIsa("scalar", avx512), CpuIsa::kScalar);
}

TEST(ResolveCpuIsaTest, MissingOrUnknownLevelIsAnError) {
  CpuFeatures avx2;
  avx2.avx2 = true;
  auto r = ResolveCpuIsa("avx512", avx2);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("avx512"), std::string::npos);
  EXPECT_FALSE(ResolveCpuIsa("avx2", CpuFeatures{}).ok());
  EXPECT_FALSE(ResolveCpuIsa("sse9", avx2).ok());
}

TEST(DetectCpuFeaturesTest, LevelsAreNested) {
  const CpuFeatures& f = DetectCpuFeatures();
  if (f.avx512) {
    EXPECT_TRUE(f.avx2);
  }
  if (f.avx512_bf16 || f.amx_bf16) {
    EXPECT_TRUE(f.avx512);
  }
  EXPECT_FALSE(f.ToString().empty());
}

}  // namespace
}  // namespace strata::cpu

// The vendor (which picks the GEMV prefetch distance) agrees with what
// Linux read from cpuid into /proc/cpuinfo.
TEST(DetectCpuFeaturesTest, VendorMatchesProcCpuinfo) {
  std::ifstream in("/proc/cpuinfo");
  std::string line, vendor;
  while (std::getline(in, line))
    if (line.rfind("vendor_id", 0) == 0) {
      vendor = line.substr(line.find(':') + 1);
      vendor.erase(0, vendor.find_first_not_of(" \t"));
      break;
    }
  if (vendor.empty()) GTEST_SKIP() << "no vendor_id in /proc/cpuinfo";
  EXPECT_EQ(strata::cpu::DetectCpuFeatures().intel, vendor == "GenuineIntel") << vendor;
}
