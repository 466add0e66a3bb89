// `strata status` for systemd units: canned `systemctl show` output in
// systemd 252's format (these machines have no systemd as PID 1) mapped to
// the launcher's states, and the journal's last error line, through a fake
// CommandRunner. The real binary with a fake systemctl on PATH is in
// launch_e2e_test.cc.
#include "cli/systemd_status.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>

namespace strata::cli {
namespace {

using ::testing::ElementsAre;

// What `systemctl show --timestamp=unix -p <kSystemctlProperties>
// 'strata-*.service' strata.target` prints: one block per unit.
constexpr const char* kShow = R"(Id=strata-chat.service
ActiveState=active
SubState=running
Result=success
MainPID=4242
NRestarts=1
ExecMainCode=0
ExecMainStatus=0
ExecMainStartTimestamp=@1764644000
ExecStart={ path=/usr/local/bin/strata ; argv[]=/usr/local/bin/strata serve --port=30000 --threads=1 --max-queued-requests=32 ; ignore_errors=no ; start_time=[@1764644000] ; stop_time=[n/a] ; pid=4242 ; code=(null) ; status=0/0 }

Id=strata-prefill.service
ActiveState=failed
SubState=failed
Result=exit-code
MainPID=0
NRestarts=0
ExecMainCode=1
ExecMainStatus=78
ExecMainStartTimestamp=@1764643000
ExecStart={ path=/usr/local/bin/strata ; argv[]=/usr/local/bin/strata serve --host=0.0.0.0 --port=30001 --disaggregation-mode=prefill --enable-hierarchical-cache --hicache-size=100000 ; ignore_errors=no ; start_time=[@1764643000] ; stop_time=[@1764643001] ; pid=17 ; code=exited ; status=78 }

Id=strata-broken.service
ActiveState=failed
SubState=failed
Result=start-limit-hit
MainPID=0
NRestarts=4
ExecMainCode=1
ExecMainStatus=66
ExecMainStartTimestamp=@1764643500
ExecStart={ path=/usr/local/bin/strata ; argv[]=/usr/local/bin/strata serve --model-path=/models/missing ; ignore_errors=no ; start_time=[@1764643500] ; stop_time=[@1764643500] ; pid=99 ; code=exited ; status=66 }

Id=strata-killed.service
ActiveState=activating
SubState=auto-restart
Result=signal
MainPID=0
NRestarts=2
ExecMainCode=2
ExecMainStatus=9
ExecMainStartTimestamp=@1764643900
ExecStart={ path=/usr/local/bin/strata ; argv[]=/usr/local/bin/strata serve --port=30003 ; ignore_errors=no ; start_time=[@1764643900] ; stop_time=[@1764643950] ; pid=123 ; code=killed ; status=9/KILL }

Id=strata-starting.service
ActiveState=activating
SubState=start
Result=success
MainPID=555
NRestarts=0
ExecMainCode=0
ExecMainStatus=0
ExecMainStartTimestamp=@1764644090
ExecStart={ path=/usr/local/bin/strata ; argv[]=/usr/local/bin/strata router --port=8000 ; ignore_errors=no ; start_time=[@1764644090] ; stop_time=[n/a] ; pid=555 ; code=(null) ; status=0/0 }

Id=strata-off.service
ActiveState=inactive
SubState=dead
Result=success
MainPID=0
NRestarts=0
ExecMainCode=0
ExecMainStatus=0
ExecMainStartTimestamp=
ExecStart={ path=/usr/local/bin/strata ; argv[]=/usr/local/bin/strata serve ; ignore_errors=no ; start_time=[n/a] ; stop_time=[n/a] ; pid=0 ; code=(null) ; status=0/0 }

Id=strata.target
ActiveState=active
SubState=active
Result=success
)";

TEST(SystemdStatusTest, SystemctlShowMapsToTheLaunchersStates) {
  const auto s = ParseSystemctlShow(kShow, 1764644100);
  ASSERT_EQ(s.size(), 6u);  // strata.target is not a service
  std::vector<std::string> names, states;
  for (const auto& x : s) {
    names.push_back(x.name);
    states.push_back(ServiceStateName(x.state));
  }
  EXPECT_THAT(names, ElementsAre("chat", "prefill", "broken", "killed", "starting", "off"));
  EXPECT_THAT(states, ElementsAre("running", "config-error", "crashloop", "backoff", "starting",
                                  "stopped"));

  const ServiceStatus& chat = s[0];
  EXPECT_EQ(chat.pid, 4242);
  EXPECT_EQ(chat.restarts, 1);
  EXPECT_EQ(chat.port, 30000);
  EXPECT_EQ(chat.host, "127.0.0.1");
  EXPECT_EQ(chat.role, "colocated");
  EXPECT_DOUBLE_EQ(chat.start_time_s, 1764644000);
  EXPECT_DOUBLE_EQ(chat.uptime_s, 100);
  EXPECT_FALSE(chat.last_exit_code.has_value());

  EXPECT_EQ(s[1].last_exit_code, 78);
  EXPECT_EQ(s[1].role, "prefill");
  EXPECT_EQ(s[1].host, "127.0.0.1");  // 0.0.0.0 is reached on loopback
  EXPECT_EQ(s[1].port, 30001);
  EXPECT_EQ(s[1].uptime_s, 0);  // not running
  EXPECT_EQ(s[2].last_exit_code, 66);
  EXPECT_EQ(s[2].restarts, 4);
  EXPECT_EQ(s[3].last_exit_code, 128 + 9);  // killed by SIGKILL
  EXPECT_EQ(s[4].role, "router");
  EXPECT_EQ(s[5].port, 8000);  // serve's default port
  EXPECT_EQ(s[5].start_time_s, 0);
}

class FakeRunner : public CommandRunner {
 public:
  std::map<std::string, StatusOr<std::string>> answers;  // by argv[0] + " " + unit (journal)
  std::vector<std::vector<std::string>> calls;
  StatusOr<std::string> Run(const std::vector<std::string>& argv) override {
    calls.push_back(argv);
    std::string key = argv[0];
    if (argv[0] == "journalctl") key += " " + argv[2];
    auto it = answers.find(key);
    return it == answers.end() ? StatusOr<std::string>(Unavailable(key + ": not faked"))
                               : it->second;
  }
};

TEST(SystemdStatusTest, TheJournalGivesTheLastErrorLine) {
  FakeRunner run;
  run.answers.emplace("systemctl", kShow);
  // journalctl -o json --output-fields=MESSAGE,SYSLOG_IDENTIFIER,_PID (one
  // entry a line; journalctl adds its cursor and timestamps).
  run.answers.emplace(
      "journalctl strata-broken.service",
      R"J({"__CURSOR":"s=1","MESSAGE":"Started strata-broken.service.","SYSLOG_IDENTIFIER":"systemd","_PID":"1"}
{"__CURSOR":"s=2","MESSAGE":"strata serve: loading /models/missing","SYSLOG_IDENTIFIER":"strata","_PID":"99"}
{"__CURSOR":"s=3","MESSAGE":"error: /models/missing/tokenizer.json is missing (give a model directory with its tokenizer)","SYSLOG_IDENTIFIER":"strata","_PID":"99"}
{"__CURSOR":"s=4","MESSAGE":[255,254],"SYSLOG_IDENTIFIER":"strata","_PID":"99"}
{"__CURSOR":"s=5","MESSAGE":"strata-broken.service: Main process exited, code=exited, status=66/n/a","SYSLOG_IDENTIFIER":"systemd","_PID":"1"}
{"__CURSOR":"s=6","MESSAGE":"strata-broken.service: Failed with result 'exit-code'.","SYSLOG_IDENTIFIER":"systemd","_PID":"1"}
{"__CURSOR":"s=7","MESSAGE":"strata-broken.service: Start request repeated too quickly.","SYSLOG_IDENTIFIER":"systemd","_PID":"1"}
)J");
  auto s = SystemdServices(run, 1764644100);
  ASSERT_TRUE(s.ok()) << s.status().message();
  ASSERT_EQ(s->size(), 6u);
  // The service's own error line, not systemd's "Failed with result".
  EXPECT_EQ((*s)[2].last_error,
            "error: /models/missing/tokenizer.json is missing (give a model directory with its "
            "tokenizer)");
  EXPECT_THAT((*s)[2].log_tail,
              ElementsAre("strata serve: loading /models/missing", (*s)[2].last_error));
  EXPECT_EQ((*s)[0].last_error, "");  // a journal it cannot read: nothing, not an error
  ASSERT_FALSE(run.calls.empty());
  EXPECT_THAT(run.calls[0], ElementsAre("systemctl", "show", "--timestamp=unix", "-p",
                                        kSystemctlProperties, "strata-*.service"));
  EXPECT_THAT(run.calls[3],
              ElementsAre("journalctl", "-u", "strata-broken.service", "-n", "60", "--no-pager",
                          "-q", "-o", "json", "--output-fields=MESSAGE,SYSLOG_IDENTIFIER,_PID"));
}

TEST(SystemdStatusTest, ASystemctlFailureIsAnError) {
  FakeRunner run;
  run.answers.emplace("systemctl", Unavailable("systemctl show failed (exit 1: System has not "
                                               "been booted with systemd as init system (PID 1))"));
  auto s = SystemdServices(run, 0);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), ::testing::HasSubstr("PID 1"));
}

TEST(SystemdStatusTest, TheProcessRunnerReturnsOutputAndNamesFailures) {
  auto run = MakeProcessRunner();
  auto ok = run->Run({"printf", "a\\nb\\n"});
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(*ok, "a\nb\n");
  auto bad = run->Run({"sh", "-c", "echo nope >&2; exit 3"});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "sh -c echo nope >&2; exit 3 failed (exit 3: nope)");
}

}  // namespace
}  // namespace strata::cli
