#include "util/host_memory.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace strata {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr uint64_t kGiB = uint64_t{1} << 30;

// A fake "/" written by the test.
class FakeRoot {
 public:
  FakeRoot() {
    static int n = 0;
    dir_ = ::testing::TempDir() + "/host_memory_" + std::to_string(getpid()) + "_" +
           std::to_string(n++);
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  ~FakeRoot() { fs::remove_all(dir_); }
  void Write(const std::string& rel, const std::string& text) {
    const fs::path p = fs::path(dir_) / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  // A node meminfo in the kernel's format (values in kB).
  void Node(int n, uint64_t total_kb, uint64_t free_kb, uint64_t active_file_kb,
            uint64_t inactive_file_kb, uint64_t sreclaimable_kb) {
    const std::string p = "Node " + std::to_string(n) + " ";
    Write("sys/devices/system/node/node" + std::to_string(n) + "/meminfo",
          p + "MemTotal:       " + std::to_string(total_kb) + " kB\n" + p +
              "MemFree:        " + std::to_string(free_kb) + " kB\n" + p +
              "MemUsed:        " + std::to_string(total_kb - free_kb) + " kB\n" + p +
              "Active(file):   " + std::to_string(active_file_kb) + " kB\n" + p +
              "Inactive(file): " + std::to_string(inactive_file_kb) + " kB\n" + p +
              "SReclaimable:   " + std::to_string(sreclaimable_kb) + " kB\n" + p +
              "HugePages_Total:     0\n");
  }
  void Meminfo(uint64_t total_kb, uint64_t available_kb) {
    Write("proc/meminfo", "MemTotal:       " + std::to_string(total_kb) +
                              " kB\nMemFree:        1000 kB\n" +
                              "MemAvailable:   " + std::to_string(available_kb) + " kB\n");
  }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
};

TEST(HostMemoryTest, TwoNodesAllowedListAndTheTightestCgroupV2Limit) {
  FakeRoot r;
  r.Meminfo(200 * 1024 * 1024, 150 * 1024 * 1024);
  // node 0: 100 GiB, 60 GiB free + 10 + 5 GiB page cache + 1 GiB slab.
  r.Node(0, 100 * 1024 * 1024, 60 * 1024 * 1024, 10 * 1024 * 1024, 5 * 1024 * 1024, 1024 * 1024);
  r.Node(1, 100 * 1024 * 1024, 80 * 1024 * 1024, 0, 0, 0);
  r.Write("sys/devices/system/node/possible", "0-1\n");  // not a node directory
  r.Write("proc/self/status",
          "Name:\tstrata\nMems_allowed:\t00000003\nMems_allowed_list:\t0-1\nVmRSS:\t1 kB\n");
  r.Write("proc/self/cgroup", "0::/a/b\n");
  r.Write("sys/fs/cgroup/a/b/memory.max", "max\n");
  r.Write("sys/fs/cgroup/a/b/memory.current", "1000\n");
  r.Write("sys/fs/cgroup/a/memory.max", std::to_string(120 * kGiB) + "\n");
  r.Write("sys/fs/cgroup/a/memory.current", std::to_string(30 * kGiB) + "\n");
  auto f = ReadHostMemoryFacts(r.dir());
  ASSERT_TRUE(f.ok()) << f.status().message();
  ASSERT_EQ(f->nodes.size(), 2u);
  EXPECT_EQ(f->nodes[0].node, 0);
  EXPECT_EQ(f->nodes[0].total_bytes, 100 * kGiB);
  EXPECT_EQ(f->nodes[0].free_bytes, 76 * kGiB);
  EXPECT_EQ(f->nodes[1].free_bytes, 80 * kGiB);
  EXPECT_THAT(f->allowed_nodes, ElementsAre(0, 1));
  EXPECT_EQ(f->cgroup_limit_bytes, 120 * kGiB);
  EXPECT_EQ(f->cgroup_usage_bytes, 30 * kGiB);
  EXPECT_THAT(f->cgroup_path, HasSubstr("sys/fs/cgroup/a"));
  EXPECT_EQ(f->mem_available_bytes, 150 * kGiB);
  // Both nodes: 156 GiB free, but the cgroup leaves 90.
  EXPECT_EQ(AllowedFreeBytes(*f, -1), 90 * kGiB);
  EXPECT_EQ(AllowedFreeBytes(*f, 0), 76 * kGiB);
  EXPECT_EQ(AllowedTotalBytes(*f, -1), 200 * kGiB);
  EXPECT_EQ(AllowedTotalBytes(*f, 1), 100 * kGiB);
  EXPECT_EQ(AllowedFreeBytes(*f, 7), 0u);  // a node that does not exist
  // Never more than MemAvailable of the whole machine.
  HostMemoryFacts capped = *f;
  capped.cgroup_limit_bytes = 0;
  EXPECT_EQ(AllowedFreeBytes(capped, -1), 150 * kGiB);
  capped.mem_available_bytes = 0;  // unknown: no cap
  EXPECT_EQ(AllowedFreeBytes(capped, -1), 156 * kGiB);
}

TEST(HostMemoryTest, TheCgroupWithTheLeastHeadroomWins) {
  FakeRoot r;
  r.Meminfo(64 * 1024 * 1024, 60 * 1024 * 1024);
  r.Write("proc/self/cgroup", "0::/outer/inner/\n");
  // inner: 50 GiB limit, 45 used (5 left); outer: 40 limit, 20 used (20 left).
  r.Write("sys/fs/cgroup/outer/inner/memory.max", std::to_string(50 * kGiB));
  r.Write("sys/fs/cgroup/outer/inner/memory.current", std::to_string(45 * kGiB));
  r.Write("sys/fs/cgroup/outer/memory.max", std::to_string(40 * kGiB));
  r.Write("sys/fs/cgroup/outer/memory.current", std::to_string(20 * kGiB));
  auto f = ReadHostMemoryFacts(r.dir());
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->cgroup_limit_bytes, 50 * kGiB);
  EXPECT_EQ(CgroupHeadroomBytes(*f), 5 * kGiB);
  EXPECT_EQ(AllowedFreeBytes(*f, -1), 5 * kGiB);
}

TEST(HostMemoryTest, CgroupV1MemoryControllerAndItsNoLimitSpelling) {
  FakeRoot r;
  r.Meminfo(64 * 1024 * 1024, 60 * 1024 * 1024);
  r.Write("proc/self/cgroup", "4:cpu,memory:/docker/abc\n3:cpuset:/\n");
  r.Write("sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes", std::to_string(8 * kGiB) + "\n");
  r.Write("sys/fs/cgroup/memory/docker/abc/memory.usage_in_bytes", std::to_string(1 * kGiB) + "\n");
  r.Write("sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
  auto f = ReadHostMemoryFacts(r.dir());
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->cgroup_limit_bytes, 8 * kGiB);
  EXPECT_EQ(AllowedFreeBytes(*f, -1), 7 * kGiB);

  // The process's cgroup directory is not visible (a namespaced path): the
  // walk goes up to the root, whose ~2^63 means no limit.
  FakeRoot hidden;
  hidden.Meminfo(64 * 1024 * 1024, 60 * 1024 * 1024);
  hidden.Write("proc/self/cgroup", "4:memory:/process_api/91357abb\n");
  hidden.Write("sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
  hidden.Write("sys/fs/cgroup/memory/memory.usage_in_bytes", "1716105216\n");
  auto h = ReadHostMemoryFacts(hidden.dir());
  ASSERT_TRUE(h.ok()) << h.status().message();
  EXPECT_EQ(h->cgroup_limit_bytes, 0u);
  EXPECT_EQ(CgroupHeadroomBytes(*h), UINT64_MAX);
  EXPECT_EQ(AllowedFreeBytes(*h, -1), 60 * kGiB);
}

TEST(HostMemoryTest, WithoutNodeDirectoriesOneNodeComesFromProcMeminfo) {
  FakeRoot r;
  r.Meminfo(32 * 1024 * 1024, 20 * 1024 * 1024);
  auto f = ReadHostMemoryFacts(r.dir());
  ASSERT_TRUE(f.ok()) << f.status().message();
  ASSERT_EQ(f->nodes.size(), 1u);
  EXPECT_EQ(f->nodes[0].node, 0);
  EXPECT_EQ(f->nodes[0].total_bytes, 32 * kGiB);
  EXPECT_EQ(f->nodes[0].free_bytes, 20 * kGiB);
  EXPECT_TRUE(f->allowed_nodes.empty());  // no status file: every node
  EXPECT_THAT(f->NodesFor(-1), ElementsAre(0));
  EXPECT_EQ(f->cgroup_limit_bytes, 0u);
  EXPECT_EQ(AllowedFreeBytes(*f, -1), 20 * kGiB);
}

TEST(HostMemoryTest, OnlyAllowedNodesCountAndOddRangesParse) {
  FakeRoot r;
  r.Meminfo(300 * 1024 * 1024, 250 * 1024 * 1024);
  for (int n : {0, 1, 3}) r.Node(n, 100 * 1024 * 1024, (10 + n) * 1024 * 1024, 0, 0, 0);
  r.Write("proc/self/status", "Mems_allowed_list:\t1,3\n");
  auto f = ReadHostMemoryFacts(r.dir());
  ASSERT_TRUE(f.ok()) << f.status().message();
  ASSERT_EQ(f->nodes.size(), 3u);
  EXPECT_EQ(f->nodes[2].node, 3);
  EXPECT_THAT(f->NodesFor(-1), ElementsAre(1, 3));
  EXPECT_EQ(AllowedFreeBytes(*f, -1), 24 * kGiB);
  EXPECT_EQ(AllowedTotalBytes(*f, -1), 200 * kGiB);

  EXPECT_THAT(*ParseNodeList(" 0-1,3\n"), ElementsAre(0, 1, 3));
  EXPECT_THAT(*ParseNodeList("2,0-1,1"), ElementsAre(0, 1, 2));
  EXPECT_TRUE(ParseNodeList("")->empty());
  for (const char* bad : {"1-0", "a", "0-", "0,,1", "-1", "0-99999"}) {
    auto p = ParseNodeList(bad);
    EXPECT_FALSE(p.ok()) << bad;
    if (!p.ok()) {
      EXPECT_THAT(p.status().message(), HasSubstr("not a NUMA node list")) << bad;
    }
  }
  EXPECT_EQ(FormatNodeList({0, 1, 3}), "0-1,3");
  EXPECT_EQ(FormatNodeList({0}), "0");
  EXPECT_EQ(FormatNodeList({0, 2, 3, 4, 7}), "0,2-4,7");
  EXPECT_EQ(FormatNodeList({}), "");
}

TEST(HostMemoryTest, MissingAndMalformedFiles) {
  FakeRoot empty;
  auto none = ReadHostMemoryFacts(empty.dir());
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(none.status().message(), HasSubstr("proc/meminfo"));

  FakeRoot no_total;
  no_total.Meminfo(1024, 1024);
  no_total.Write("sys/devices/system/node/node0/meminfo", "Node 0 MemFree: 12 kB\n");
  auto nt = ReadHostMemoryFacts(no_total.dir());
  ASSERT_FALSE(nt.ok());
  EXPECT_THAT(nt.status().message(), HasSubstr("node0/meminfo has no MemTotal"));

  FakeRoot bad_list;
  bad_list.Meminfo(1024, 1024);
  bad_list.Write("proc/self/status", "Mems_allowed_list:\tzero\n");
  auto bl = ReadHostMemoryFacts(bad_list.dir());
  ASSERT_FALSE(bl.ok());
  EXPECT_THAT(bl.status().message(), HasSubstr("Mems_allowed_list"));

  // Node meminfo without proc/meminfo is enough; a cgroup file with junk is
  // no limit (the kernel never writes one; the value cannot be trusted).
  FakeRoot nodes_only;
  nodes_only.Node(0, 1024 * 1024, 512 * 1024, 0, 0, 0);
  nodes_only.Write("proc/self/cgroup", "0::/\n");
  nodes_only.Write("sys/fs/cgroup/memory.max", "lots\n");
  auto no = ReadHostMemoryFacts(nodes_only.dir());
  ASSERT_TRUE(no.ok()) << no.status().message();
  EXPECT_EQ(no->mem_available_bytes, 0u);
  EXPECT_EQ(no->cgroup_limit_bytes, 0u);
  EXPECT_EQ(AllowedFreeBytes(*no, -1), kGiB / 2);
}

TEST(HostMemoryTest, TheRealMachineHasAtLeastOneNodeWithFreeAtMostTotal) {
  auto f = ReadHostMemoryFacts("/");
  ASSERT_TRUE(f.ok()) << f.status().message();
  ASSERT_GE(f->nodes.size(), 1u);
  uint64_t total = 0;
  for (const auto& n : f->nodes) {
    total += n.total_bytes;  // a memoryless (CPU-only) node has 0
    EXPECT_LE(n.free_bytes, n.total_bytes) << "node " << n.node;
  }
  EXPECT_GT(total, 0u);
  EXPECT_FALSE(f->NodesFor(-1).empty());
  EXPECT_GT(AllowedFreeBytes(*f, -1), 0u);
  EXPECT_GT(f->mem_available_bytes, 0u);
}

TEST(HostMemoryTest, BindToAnAllowedNodeWorksAndToAMissingNodeFails) {
  auto f = ReadHostMemoryFacts("/");
  ASSERT_TRUE(f.ok()) << f.status().message();
  const size_t bytes = size_t{4} << 20;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  Status ok = BindToNumaNode(p, bytes, f->NodesFor(-1).front());
  EXPECT_TRUE(ok.ok()) << ok.message();
  static_cast<char*>(p)[0] = 1;  // first touch after the bind
  Status missing = BindToNumaNode(p, bytes, 1000);
  EXPECT_FALSE(missing.ok());
  EXPECT_THAT(missing.message(), HasSubstr("NUMA node 1000"));
  EXPECT_FALSE(BindToNumaNode(p, bytes, -1).ok());
  munmap(p, bytes);
}

}  // namespace
}  // namespace strata
