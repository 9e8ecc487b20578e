// core/dist in one process: how a launch is detected, the refusal of a build without MPI, and
// the rank checks (settings, weight hashes) against a stand-in for a second rank.
#include "core/dist/communicator.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

#include "core/dist/data_parallel.h"
#include "core/error.h"

namespace ct::dist {
namespace {

// Rank 0 of 2 whose peer, rank 1, answers `peer` in all_gather; with `echo`, the peer answers
// what this rank sends (an identical rank), and `sent` keeps it.
class TwoRanks final : public Communicator {
 public:
  std::string peer, sent;
  bool echo = false;
  int rank() const override { return 0; }
  int size() const override { return 2; }
  int local_rank() const override { return 0; }
  int local_size() const override { return 2; }
  std::string host() const override { return "test"; }
  std::string transport() const override { return "test"; }
  void all_reduce(float*, size_t, ReduceOp) override {}
  void all_reduce(double*, size_t, ReduceOp) override {}
  void reduce_scatter(float*, const std::vector<size_t>&, ReduceOp) override {}
  void all_gather(float*, const std::vector<size_t>&) override {}
  void broadcast(void*, size_t, int) override {}
  std::vector<std::string> all_gather(const std::string& mine) override {
    sent = mine;
    return {mine, echo ? mine : peer};
  }
  void barrier() override {}
  void set_timeout(double) override {}
  void abort(int) override {}
};

template <class F>
std::string error_of(F&& f, ErrorKind kind) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(static_cast<int>(e.kind()), static_cast<int>(kind)) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no ct::Error thrown";
  return "";
}

// Sets the environment variable for the scope, restoring it after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) had_ = true, old_ = old;
    if (value)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ~ScopedEnv() {
    if (had_)
      setenv(name_, old_.c_str(), 1);
    else
      unsetenv(name_);
  }

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

TEST(Launch, DetectedFromTheLaunchersEnvironment) {
  ScopedEnv ompi("OMPI_COMM_WORLD_SIZE", nullptr), pmi("PMI_SIZE", nullptr),
      pmix("PMIX_RANK", nullptr);
  EXPECT_FALSE(detect_launch().launched());
  EXPECT_EQ(detect_launch().size, 1);
  {
    ScopedEnv set("PMI_SIZE", "3");
    EXPECT_EQ(detect_launch().size, 3);
    EXPECT_EQ(detect_launch().variable, "PMI_SIZE=3");
  }
  ScopedEnv set("OMPI_COMM_WORLD_SIZE", "2");
  EXPECT_TRUE(detect_launch().launched());
  EXPECT_EQ(detect_launch().size, 2);
  EXPECT_EQ(detect_launch().variable, "OMPI_COMM_WORLD_SIZE=2");
}

// A build without MPI started by mpirun as several processes: each would train alone, so it
// refuses, naming the launcher's variable and what to install. One process trains as today.
TEST(Launch, BuildWithoutMpiRefusesSeveralProcesses) {
  const std::string what = error_of(
      [] {
        make_communicator({2, "OMPI_COMM_WORLD_SIZE=2"}, /*with_mpi=*/false);
      },
      ErrorKind::kInvalidArgument);
  for (const char* part : {"built without MPI", "one of 2 processes", "OMPI_COMM_WORLD_SIZE=2",
                           "libopenmpi-dev openmpi-bin"})
    EXPECT_NE(what.find(part), std::string::npos) << "lacks '" << part << "': " << what;
  for (const Launch& l : {Launch{}, Launch{1, "OMPI_COMM_WORLD_SIZE=1"}}) {
    auto c = make_communicator(l, /*with_mpi=*/false);
    EXPECT_EQ(c->rank(), 0);
    EXPECT_EQ(c->size(), 1);
    EXPECT_EQ(c->transport(), "single process");
  }
  // Not launched: the single process, with or without MPI (MPI_Init is never called).
  EXPECT_EQ(make_communicator({}, /*with_mpi=*/true)->size(), 1);
}

TEST(SingleProcess, CollectivesAreTheIdentity) {
  auto c = make_single_process();
  float x[3] = {1, 2, 3};
  c->all_reduce(x, 3, ReduceOp::kAverage);
  EXPECT_EQ(x[2], 3.0f);
  EXPECT_EQ(c->all_gather("abc"), std::vector<std::string>{"abc"});
  c->reduce_scatter(x, {3}, ReduceOp::kAverage);
  c->all_gather(x, {3});
  EXPECT_EQ(x[0], 1.0f);
  EXPECT_EQ(x[2], 3.0f);
  check_same_settings(*c, {{"--seed", "1"}});  // nothing to compare with
  check_same_weights(*c, 42, "now");
}

// The settings check names the rank and every flag that differs, with both values.
TEST(RankChecks, SettingsMismatchNamesTheRankAndFlags) {
  const std::vector<std::pair<std::string, std::string>> mine = {
      {"--model", "tiny"}, {"--seed", "42"}, {"--per-device-train-batch-size", "4"}};
  auto theirs = mine;
  theirs[1].second = "7";
  theirs[2].second = "8";
  TwoRanks rank1;  // what rank 1 sends: its own list
  rank1.echo = true;
  check_same_settings(rank1, theirs);  // identical ranks pass
  TwoRanks rank0;
  rank0.peer = rank1.sent;
  const std::string what =
      error_of([&] { check_same_settings(rank0, mine); }, ErrorKind::kInvalidArgument);
  for (const char* part : {"rank 1 of 2", "--seed '7' where rank 0 has '42'",
                           "--per-device-train-batch-size '8' where rank 0 has '4'"})
    EXPECT_NE(what.find(part), std::string::npos) << "lacks '" << part << "': " << what;
  EXPECT_EQ(what.find("--model"), std::string::npos) << what;
}

TEST(RankChecks, WeightHashMismatchNamesTheRank) {
  const float w[4] = {1, 2, 3, 4};
  float v[4] = {1, 2, 3, 4};
  EXPECT_EQ(hash_bytes(w, sizeof w), hash_bytes(v, sizeof v));
  v[3] = std::nextafter(4.0f, 5.0f);
  EXPECT_NE(hash_bytes(w, sizeof w), hash_bytes(v, sizeof v));
  TwoRanks same;
  same.echo = true;
  check_same_weights(same, hash_bytes(w, sizeof w), "at step 3");
  TwoRanks other;
  other.peer = "00000000000000ff";
  const std::string what =
      error_of([&] { check_same_weights(other, hash_bytes(w, sizeof w), "at step 3"); },
               ErrorKind::kInternal);
  for (const char* part : {"weights differ at step 3", "rank(s) 1 00000000000000ff"})
    EXPECT_NE(what.find(part), std::string::npos) << "lacks '" << part << "': " << what;
}

// The host CPU is one device that local ranks share (their threads divided); an explicit index
// stands.
TEST(RankChecks, DeviceForRank) {
  std::string why;
  EXPECT_EQ(device_for_rank("cpu", 1, &why), "cpu:0");
  EXPECT_NE(why.find("shared"), std::string::npos) << why;
  EXPECT_EQ(device_for_rank("cpu:1", 0, &why), "cpu:1");
  EXPECT_EQ(why, "--backend cpu:1 as given");
  const int threads = host_threads_for_rank(2, &why);
  EXPECT_GE(threads, 1) << why;
}

}  // namespace
}  // namespace ct::dist
