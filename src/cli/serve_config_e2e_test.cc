// End-to-end tests of `strata serve` startup and shutdown through the real
// binary: configuration that would silently open the server or fail late is
// exit 78 before the weights load; every signal is logged; SIGHUP and
// SIGUSR1/2 are ignored; a second SIGTERM or the drain deadline ends
// in-flight streams with an error event and a non-zero exit.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "cli/serve_test_process.h"
#include "server/http_test_client.h"

namespace {

using namespace strata::http_test;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr auto kExit = std::chrono::seconds(20);

TEST(ServeConfigTest, EmptyValuesAreConfigErrorsBeforeAnythingLoads) {
  // A model path that does not exist: reaching it would exit 66, so 78 shows
  // the flag was refused first.
  for (const char* flag : {"--host", "--api-key", "--served-model-name", "--model-path"}) {
    Server s({"--model-path", "/nonexistent", flag, ""});
    EXPECT_EQ(s.WaitExit(kExit), 78) << flag;
    EXPECT_THAT(s.Log(), HasSubstr(std::string(flag) + " is empty")) << flag;
  }
  Server eq({"--model-path", "/nonexistent", "--api-key="});
  EXPECT_EQ(eq.WaitExit(kExit), 78);
  EXPECT_THAT(eq.Log(), HasSubstr("--api-key is empty"));
}

// A copy of a fixture model without its weights file: if the weights were
// read before the address was bound, the exit would be 66 (missing file).
std::string ModelWithoutWeights() {
  namespace fs = std::filesystem;
  const std::string dir =
      ::testing::TempDir() + "/serve_config_noweights_" + std::to_string(getpid());
  fs::remove_all(dir);
  fs::copy(Fixture("llama_default"), dir, fs::copy_options::recursive);
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".safetensors") fs::remove(e.path());
  return dir;
}

TEST(ServeConfigTest, AnAddressThatCannotBeBoundIsExit78BeforeWeightsLoad) {
  const std::string model = ModelWithoutWeights();
  Server bad_ip({"--model-path", model, "--host", "999.1.1.1"});
  EXPECT_EQ(bad_ip.WaitExit(kExit), 78);
  EXPECT_THAT(bad_ip.Log(), HasSubstr("cannot resolve host '999.1.1.1'"));
  // TEST-NET-1 (RFC 5737): never an address of this machine.
  Server foreign({"--model-path", model, "--host", "192.0.2.1"});
  EXPECT_EQ(foreign.WaitExit(kExit), 78);
  EXPECT_THAT(foreign.Log(), HasSubstr("192.0.2.1"));
  EXPECT_THAT(foreign.Log(), HasSubstr("not on this machine"));
  // A port another server holds.
  Server holder({"--model-path", Fixture("llama_default")});
  ASSERT_GT(holder.port(), 0) << holder.Log();
  Server taken({"--model-path", model, "--port", std::to_string(holder.port())});
  EXPECT_EQ(taken.WaitExit(kExit), 78);
  EXPECT_THAT(taken.Log(), HasSubstr("Address already in use"));
  EXPECT_THAT(taken.Log(), Not(HasSubstr("loaded")));
}

TEST(ServeConfigTest, ListeningBeyondLoopbackWithoutAKeyIsWarned) {
  // Binding every interface is safe in a test: all traffic goes to 127.0.0.1.
  Server open({"--model-path", Fixture("llama_default"), "--host", "0.0.0.0"});
  ASSERT_GT(open.port(), 0) << open.Log();
  EXPECT_THAT(open.Log(), HasSubstr("listening on 0.0.0.0:" + std::to_string(open.port())));
  EXPECT_THAT(open.Log(), HasSubstr("without --api-key"));
  Server keyed({"--model-path", Fixture("llama_default"), "--host", "0.0.0.0", "--api-key", "k"});
  ASSERT_GT(keyed.port(), 0) << keyed.Log();
  EXPECT_THAT(keyed.Log(), Not(HasSubstr("without --api-key")));
  Server local({"--model-path", Fixture("llama_default")});
  ASSERT_GT(local.port(), 0) << local.Log();
  EXPECT_THAT(local.Log(), Not(HasSubstr("without --api-key")));
}

TEST(ServeConfigTest, TotalBodyCapBelowTheRequestLimitIsExit78) {
  Server s({"--model-path", "/nonexistent", "--max-request-body-bytes", "4096",
            "--max-total-request-body-bytes", "2048"});
  EXPECT_EQ(s.WaitExit(kExit), 78);
  EXPECT_THAT(s.Log(), HasSubstr("--max-total-request-body-bytes 2048"));
}

// --mem-fraction-static (issue 10): out of range, or given with --device
// cpu, is exit 78 before anything loads (a missing model would be 66).
TEST(ServeConfigTest, MemFractionStaticErrorsAreExit78BeforeAnythingLoads) {
  struct Case {
    std::vector<std::string> flags;
    std::string says;
  };
  for (const Case& c :
       {Case{{"--device", "cuda", "--mem-fraction-static", "0"}, "is outside (0, 1]"},
        Case{{"--device", "cuda", "--mem-fraction-static", "1.5"}, "is outside (0, 1]"},
        Case{{"--mem-fraction-static", "0.8"}, "does nothing with --device cpu"},
        Case{{"--device", "cpu", "--mem-fraction-static=0.9"}, "does nothing with --device cpu"}}) {
    std::vector<std::string> args = {"--model-path", "/nonexistent"};
    args.insert(args.end(), c.flags.begin(), c.flags.end());
    Server s(args);
    EXPECT_EQ(s.WaitExit(kExit), 78) << c.flags.back() << "\n" << s.Log();
    EXPECT_THAT(s.Log(), HasSubstr("--mem-fraction-static")) << c.flags.back();
    EXPECT_THAT(s.Log(), HasSubstr(c.says)) << c.flags.back();
  }
}

// The key is checked when the head arrives: a client announcing a 30 MB
// body gets its 401 without sending a byte of it.
TEST(ServeConfigTest, UnauthenticatedBodiesAreRefusedBeforeTheyAreRead) {
  Server s({"--model-path", Fixture("llama_default"), "--api-key", "secret"});
  ASSERT_GT(s.port(), 0) << s.Log();
  Client c(s.port(), true);
  ASSERT_TRUE(
      c.Send("POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
             "Content-Length: 31457280\r\n\r\n"));
  auto r = c.Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 401);
  EXPECT_THAT(r->body, HasSubstr("invalid_api_key"));
  // With the key (any case of the scheme) the same route works.
  Response ok = s.PostJson("/v1/completions", R"({"prompt": "hi", "max_tokens": 2})",
                           "Authorization: bearer secret\r\n");
  EXPECT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(s.Request(Get("/debug/integrity")).status, 401);
  EXPECT_EQ(s.Request(Get("/health")).status, 200);
}

TEST(ServeConfigTest, HupAndUsrSignalsAreLoggedAndIgnored) {
  Server s({"--model-path", Fixture("llama_default")});
  ASSERT_GT(s.port(), 0) << s.Log();
  for (int sig : {SIGHUP, SIGUSR1, SIGUSR2, SIGALRM}) s.Signal(sig);
  EXPECT_TRUE(
      Eventually([&] { return s.Log().find("SIGALRM received; ignored") != std::string::npos; }));
  EXPECT_FALSE(s.Exited());
  EXPECT_EQ(s.Request(Get("/health")).status, 200);
  const std::string log = s.Log();
  EXPECT_THAT(log, HasSubstr("SIGHUP received; ignored (logs go to stderr"));
  EXPECT_THAT(log, HasSubstr("SIGUSR1 received; ignored"));
  EXPECT_THAT(log, HasSubstr("SIGUSR2 received; ignored"));
  s.Signal(SIGTERM);
  EXPECT_EQ(s.WaitExit(kExit), 0);
  EXPECT_THAT(s.Log(), HasSubstr("SIGTERM: draining"));
  EXPECT_THAT(s.Log(), HasSubstr("drained; exiting"));
}

TEST(ServeConfigTest, ACrashSignalLeavesALastLine) {
  Server s({"--model-path", Fixture("llama_default")});
  ASSERT_GT(s.port(), 0) << s.Log();
  s.Signal(SIGSEGV);
  EXPECT_EQ(s.WaitExit(kExit), -100 - SIGSEGV);
  EXPECT_THAT(s.Log(), HasSubstr("fatal signal SIGSEGV"));
}

// A stream that runs for many seconds (8 choices of 2,000 tokens computed
// one at a time under --max-running-requests 1), read on its own thread.
// A stream that outlasts every deadline of these tests: 64 choices of 2,000
// tokens one at a time (--max-running-requests 1). With n = 8 it ended
// within 1 s on an AVX-512 2-core machine.
struct LongStream {
  Client client;
  std::thread reader;
  std::optional<Response> response;
  std::atomic<bool> first{false};
  explicit LongStream(int port) : client(port, true) {
    const std::string body =
        R"({"prompt": "hello", "max_tokens": 2000, "n": 64, "ignore_eos": true, "stream": true})";
    EXPECT_TRUE(client.Send(Post("/v1/completions", body, "Content-Type: application/json\r\n")));
    reader = std::thread(
        [this] { response = client.Read([this](const std::string&) { first = true; }); });
  }
  ~LongStream() {
    if (reader.joinable()) reader.join();
  }
  std::optional<Response>& Finish() {
    reader.join();
    return response;
  }
};

TEST(ServeConfigTest, SecondSigtermEndsStreamsWithAnErrorEventAndExitsNonZero) {
  Server s({"--model-path", Fixture("llama_default"), "--max-running-requests", "1"});
  ASSERT_GT(s.port(), 0) << s.Log();
  LongStream stream(s.port());
  ASSERT_TRUE(Eventually([&] { return stream.first.load(); }, std::chrono::seconds(20)));
  s.Signal(SIGTERM);
  ASSERT_TRUE(Eventually([&] { return s.Log().find("draining") != std::string::npos; }));
  EXPECT_FALSE(s.Exited());  // the stream is still being served
  s.Signal(SIGTERM);
  auto& r = stream.Finish();
  ASSERT_TRUE(r.has_value()) << "the stream did not end cleanly (chunked terminator)";
  EXPECT_EQ(r->status, 200);
  EXPECT_THAT(r->body, HasSubstr("\"error\""));
  EXPECT_THAT(r->body, HasSubstr("shutting down"));
  EXPECT_EQ(s.WaitExit(kExit), 128 + SIGTERM);
  EXPECT_THAT(s.Log(), HasSubstr("second signal (SIGTERM): aborting 1 in-flight requests"));
}

TEST(ServeConfigTest, DrainDeadlineAbortsWhatIsLeft) {
  Server s({"--model-path", Fixture("llama_default"), "--max-running-requests", "1",
            "--drain-timeout-s", "1"});
  ASSERT_GT(s.port(), 0) << s.Log();
  LongStream stream(s.port());
  ASSERT_TRUE(Eventually([&] { return stream.first.load(); }, std::chrono::seconds(20)));
  s.Signal(SIGTERM);
  auto& r = stream.Finish();
  ASSERT_TRUE(r.has_value());
  EXPECT_THAT(r->body, HasSubstr("drain deadline of 1 s passed"));
  EXPECT_EQ(s.WaitExit(kExit), 1);
  EXPECT_THAT(s.Log(), HasSubstr("drain deadline of 1 s passed: aborting 1 in-flight requests"));
}

// HiCache flags (issue 7): every refusal is exit 78 before the weights load
// (the model has no weights file: reaching the load would be exit 66).
TEST(ServeConfigTest, AHostTierLargerThanThisMachineIsExit78WithTheNumbersAndWhatFits) {
  const std::string model = ModelWithoutWeights();
  Server s({"--model-path", model, "--enable-hierarchical-cache", "--hicache-size", "100000"});
  EXPECT_EQ(s.WaitExit(kExit), 78);
  const std::string log = s.Log();
  EXPECT_THAT(log, HasSubstr("--hicache-size 100000 asks for"));
  EXPECT_THAT(log, HasSubstr("100000.00 GB (full_attention 100000.00 GB)"));
  EXPECT_THAT(log, HasSubstr("for a device pool of"));
  EXPECT_THAT(log, HasSubstr("GB free on"));
  EXPECT_THAT(log, HasSubstr("less a reserve of"));
  EXPECT_THAT(log, HasSubstr("At most --hicache-ratio"));
  EXPECT_THAT(log, Not(HasSubstr("loaded")));
}

TEST(ServeConfigTest, HiCacheFlagErrorsAreExit78BeforeWeightsLoad) {
  const std::string model = ModelWithoutWeights();
  struct Case {
    std::vector<std::string> flags;
    std::vector<std::string> says;
  };
  const std::string not_a_dir =
      ::testing::TempDir() + "/serve_config_e2e_file_" + std::to_string(getpid());
  { std::ofstream(not_a_dir) << "x"; }
  const std::vector<Case> cases = {
      {{"--enable-hierarchical-cache", "--hicache-ratio", "1"},
       {"--hicache-ratio 1 must exceed 1", "extends nothing"}},
      {{"--enable-hierarchical-cache", "--hicache-ratio", "2", "--hicache-size", "1"},
       {"--hicache-ratio and --hicache-size were both given"}},
      {{"--hicache-ratio", "2"},
       {"--hicache-ratio has no effect without --enable-hierarchical-cache"}},
      {{"--numa-node", "0"}, {"--numa-node has no effect without --enable-hierarchical-cache"}},
      {{"--enable-hierarchical-cache", "--hicache-write-policy", "write-back"},
       {"'write-back' is not one of write_through, write_through_selective, write_back"}},
      {{"--enable-hierarchical-cache", "--numa-node", "99"},
       {"--numa-node 99: this machine has no such NUMA node"}},
      {{"--enable-hierarchical-cache", "--disable-radix-cache"},
       {"--disable-radix-cache turns off"}},
      {{"--enable-hierarchical-cache", "--hicache-storage-backend", "file"},
       {"needs --hicache-storage-path DIR"}},
      {{"--enable-hierarchical-cache", "--hicache-storage-path", ::testing::TempDir()},
       {"needs --hicache-storage-backend file"}},
      {{"--enable-hierarchical-cache", "--hicache-storage-backend", "file",
        "--hicache-storage-path", not_a_dir + "/sub"},
       {"cannot create directory " + not_a_dir + "/sub"}},
      {{"--enable-hierarchical-cache", "--hicache-storage-prefetch-policy", "soon"},
       {"'soon' is not one of best_effort, wait_complete, timeout"}},
      {{"--enable-hierarchical-cache", "--hicache-storage-backend", "file",
        "--hicache-storage-path", ::testing::TempDir(), "--hicache-storage-prefetch-timeout-ms",
        "10"},
       {"applies only to --hicache-storage-prefetch-policy timeout"}},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"--model-path", model};
    args.insert(args.end(), c.flags.begin(), c.flags.end());
    Server s(args);
    EXPECT_EQ(s.WaitExit(kExit), 78) << c.flags[0] << " " << c.flags.back() << "\n" << s.Log();
    for (const std::string& text : c.says) EXPECT_THAT(s.Log(), HasSubstr(text));
    EXPECT_THAT(s.Log(), Not(HasSubstr("loaded")));
  }
  std::filesystem::remove(not_a_dir);
}

TEST(ServeConfigTest, EveryConfigurationProblemIsReportedAtOnce) {
  Server s({"--model-path", ModelWithoutWeights(), "--kv-cache-dtype", "q4", "--hicache-ratio", "2",
            "--hicache-write-policy", "sometimes", "--context-length", "99999"});
  EXPECT_EQ(s.WaitExit(kExit), 78);
  const std::string log = s.Log();
  EXPECT_THAT(log, HasSubstr("invalid configuration (4 problems)"));
  EXPECT_THAT(log, HasSubstr("--kv-cache-dtype: 'q4'"));
  EXPECT_THAT(log, HasSubstr("'sometimes' is not one of"));
  EXPECT_THAT(log, HasSubstr("--hicache-ratio, --hicache-write-policy have no effect without"));
  EXPECT_THAT(log, HasSubstr("--context-length 99999 exceeds the model's max_position_embeddings"));
}

TEST(ServeConfigTest, HiCacheOnTheDemoModelStartsAndServes) {
  // The demo model is written under $STRATA_HOME, a temp dir of this test.
  const std::string home = ::testing::TempDir() + "/serve_config_home_" + std::to_string(getpid());
  setenv("STRATA_HOME", home.c_str(), 1);
  Server s({"--enable-hierarchical-cache", "--hicache-ratio", "2"});
  unsetenv("STRATA_HOME");
  ASSERT_GT(s.port(), 0) << s.Log();
  EXPECT_EQ(s.Request(Get("/health")).status, 200);
  Response r = s.PostJson("/v1/completions", R"({"prompt": "hello", "max_tokens": 3})");
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_THAT(s.Log(), HasSubstr("using the embedded demo model"));
  EXPECT_THAT(s.Log(), HasSubstr("HiCache host tier"));
  s.Signal(SIGTERM);
  EXPECT_EQ(s.WaitExit(kExit), 0);
  std::filesystem::remove_all(home);
}

}  // namespace
