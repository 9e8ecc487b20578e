// Leftovers of killed checkpoint writers: a run removes the `.checkpoint-N.tmp-PID` folders whose
// writer is dead (a real child process, SIGKILLed while writing), keeps those of a live writer,
// sees through a reused PID, and puts back a checkpoint moved aside by a writer that died.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/io/read_file.h"
#include "core/train/checkpoint.h"
#include "core/train/trainer.h"
#include "tests/train/train_test_util.h"

namespace ct {
namespace {
namespace fs = std::filesystem;

constexpr size_t kChunk = 1 << 20;

// A child process that starts writing checkpoint `step` into `out` (its temporary folder and the
// first MiB of model.safetensors), says so through a pipe, then waits to be killed.
pid_t start_writer(const fs::path& out, int64_t step) {
  int fds[2];
  if (::pipe(fds) != 0) return -1;
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    try {
      std::string tmp = make_checkpoint_temp(out.string(), step);
      std::ofstream f(tmp + "/model.safetensors", std::ios::binary);
      std::vector<char> bytes(kChunk, 'w');
      f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
      f.flush();
      if (!f || ::write(fds[1], "x", 1) != 1) ::_exit(1);
    } catch (...) {
      ::_exit(1);
    }
    for (;;) ::pause();
  }
  ::close(fds[1]);
  char c = 0;
  bool ready = pid > 0 && ::read(fds[0], &c, 1) == 1;
  ::close(fds[0]);
  return ready ? pid : -1;
}

fs::path temp_of(const fs::path& out, int64_t step, pid_t pid) {
  return out / (".checkpoint-" + std::to_string(step) + ".tmp-" + std::to_string(pid));
}

std::vector<std::string> names(const std::vector<StaleCheckpointTemp>& v) {
  std::vector<std::string> n;
  for (const auto& t : v) n.push_back(fs::path(t.path).filename().string());
  return n;
}

class StaleCheckpointTemps : public ::testing::Test {
 protected:
  void SetUp() override { root_ = testing::fresh_temp_dir("stale_ckpt"); }
  void TearDown() override {
    for (pid_t p : children_) {
      ::kill(p, SIGKILL);
      ::waitpid(p, nullptr, 0);
    }
    fs::remove_all(root_);
  }
  pid_t writer(int64_t step) {
    pid_t p = start_writer(root_, step);
    if (p > 0) children_.push_back(p);
    return p;
  }
  void kill_and_reap(pid_t p) {
    ASSERT_EQ(::kill(p, SIGKILL), 0);
    ASSERT_EQ(::waitpid(p, nullptr, 0), p);
    children_.erase(std::find(children_.begin(), children_.end(), p));
  }
  fs::path root_;
  std::vector<pid_t> children_;
};

TEST_F(StaleCheckpointTemps, RemovesAKilledWritersFolderAndKeepsALiveOnes) {
  pid_t dead = writer(3), live = writer(4);
  ASSERT_GT(dead, 0);
  ASSERT_GT(live, 0);
  ASSERT_TRUE(fs::exists(temp_of(root_, 3, dead) / "WRITER"));
  kill_and_reap(dead);
  auto done = remove_stale_checkpoint_temps(root_.string());
  ASSERT_EQ(names(done), std::vector<std::string>{temp_of(root_, 3, dead).filename().string()});
  EXPECT_GE(done[0].bytes, kChunk);
  EXPECT_LT(done[0].bytes, kChunk + 4096);  // the MiB written and the WRITER record
  EXPECT_TRUE(done[0].restored.empty());
  EXPECT_NE(done[0].why.find(std::to_string(dead)), std::string::npos) << done[0].why;
  EXPECT_FALSE(fs::exists(temp_of(root_, 3, dead)));
  EXPECT_TRUE(fs::exists(temp_of(root_, 4, live) / "model.safetensors"));  // still writing

  // Killed but not yet reaped (a zombie: the PID still answers kill(pid, 0)) is dead too.
  ASSERT_EQ(::kill(live, SIGKILL), 0);
  siginfo_t info{};
  ASSERT_EQ(::waitid(P_PID, static_cast<id_t>(live), &info, WEXITED | WNOWAIT), 0);
  ASSERT_EQ(::kill(live, 0), 0);
  done = remove_stale_checkpoint_temps(root_.string());
  EXPECT_EQ(names(done), std::vector<std::string>{temp_of(root_, 4, live).filename().string()});
  EXPECT_FALSE(fs::exists(temp_of(root_, 4, live)));
  kill_and_reap(live);
  EXPECT_TRUE(remove_stale_checkpoint_temps(root_.string()).empty());
}

TEST_F(StaleCheckpointTemps, AReusedPidIsNotTheWriter) {
  pid_t live = writer(5);
  ASSERT_GT(live, 0);
  std::string boot = read_file_bytes("/proc/sys/kernel/random/boot_id");
  boot.erase(boot.find_last_not_of(" \n") + 1);
  // Written by an earlier process with the same PID: same boot, another start time.
  fs::path reused = temp_of(root_, 6, live);
  fs::create_directories(reused);
  std::ofstream(reused / "WRITER") << live << " 1 " << boot << "\n";
  // Another boot: dead whatever the PID is now.
  fs::path rebooted = temp_of(root_, 7, live);
  fs::create_directories(rebooted);
  std::ofstream(rebooted / "WRITER") << live << " 1 not-this-boot\n";
  // No record and a running PID: left alone (it may be the writer).
  fs::path unknown = temp_of(root_, 8, live);
  fs::create_directories(unknown);
  // This process's own folder is never touched.
  fs::path own = temp_of(root_, 9, ::getpid());
  fs::create_directories(own);
  auto done = remove_stale_checkpoint_temps(root_.string());
  EXPECT_EQ(names(done),
            (std::vector<std::string>{reused.filename().string(), rebooted.filename().string()}));
  EXPECT_TRUE(fs::exists(temp_of(root_, 5, live)));
  EXPECT_TRUE(fs::exists(unknown));
  EXPECT_TRUE(fs::exists(own));
  EXPECT_FALSE(fs::exists(reused));
  EXPECT_FALSE(fs::exists(rebooted));
}

TEST_F(StaleCheckpointTemps, PutsBackACheckpointMovedAsideByAKilledWriter) {
  pid_t dead = writer(2);
  ASSERT_GT(dead, 0);
  kill_and_reap(dead);
  // Killed between save_checkpoint's two renames: checkpoint-2 moved aside, the new one unmarked.
  fs::path aside = temp_of(root_, 2, dead);
  aside += ".old";
  fs::create_directories(aside);
  std::ofstream(aside / "COMPLETE") << "old\n";
  fs::create_directories(root_ / "checkpoint-2");
  std::ofstream(root_ / "checkpoint-2" / "model.safetensors") << "new, never marked";
  auto done = remove_stale_checkpoint_temps(root_.string());
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(fs::path(done[0].path).filename(), temp_of(root_, 2, dead).filename());
  EXPECT_EQ(fs::path(done[1].path), aside);
  EXPECT_EQ(fs::path(done[1].restored), root_ / "checkpoint-2");
  EXPECT_EQ(read_file_bytes((root_ / "checkpoint-2" / "COMPLETE").string()), "old\n");
  EXPECT_FALSE(fs::exists(root_ / "checkpoint-2" / "model.safetensors"));
  EXPECT_EQ(list_checkpoints(root_.string()),
            std::vector<std::string>{(root_ / "checkpoint-2").string()});
}

TEST_F(StaleCheckpointTemps, TheNextRunRemovesThemAndSaysSo) {
  TrainArgs a = testing::small_model_args(root_);
  a.max_steps = 2;
  a.save_steps = 1;
  pid_t dead = writer(1);
  ASSERT_GT(dead, 0);
  kill_and_reap(dead);
  ::testing::internal::CaptureStdout();
  train(a);
  std::string out = ::testing::internal::GetCapturedStdout();
  std::string want = "removed " + temp_of(root_, 1, dead).string() +
                     ", left by a killed checkpoint writer (writer PID " + std::to_string(dead);
  EXPECT_NE(out.find(want), std::string::npos) << out;
  EXPECT_NE(out.find("MiB freed"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(temp_of(root_, 1, dead)));
  // The run's own checkpoints carry no WRITER record and leave no temporary folder.
  ASSERT_EQ(list_checkpoints(root_.string()).size(), 2u);
  EXPECT_FALSE(fs::exists(root_ / "checkpoint-1" / "WRITER"));
  for (const auto& e : fs::directory_iterator(root_))
    EXPECT_EQ(e.path().filename().string().find(".checkpoint-"), std::string::npos) << e.path();
}

}  // namespace
}  // namespace ct
