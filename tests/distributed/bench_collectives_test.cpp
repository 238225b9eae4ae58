// dpt-bench collectives on Gloo: every row is checked against its exact result, and the CSV has one
// line per (op, size).
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <string>

namespace {

TEST(BenchCollectives, GlooRowsAreAllCorrectAndWrittenToCsv) {
  std::string csv = std::string(DPT_BINARY_DIR) + "/bench_collectives_test.csv";
  std::string cmd = std::string(DPT_BINARY_DIR) + "/bin/dpt-run --standalone --nproc-per-node 3 -- " +
                    DPT_BINARY_DIR + "/bin/dpt-bench collectives --backend gloo --min-bytes 1K --max-bytes 16K " +
                    "--step-factor 4 --warmup 1 --iters 2 --csv " + csv + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  int status = ::pclose(p);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << out;
  EXPECT_EQ(out.find("FAILED"), std::string::npos) << out;
  std::ifstream in(csv);
  std::string line;
  int rows = 0, ok = 0;
  std::getline(in, line);
  EXPECT_EQ(line, "op,backend,dtype,ranks,bytes,count,time_us,algbw_GBps,busbw_GBps,check");
  while (std::getline(in, line)) {
    ++rows;
    if (line.size() >= 3 && line.substr(line.size() - 3) == ",OK") ++ok;
  }
  EXPECT_EQ(rows, 4 * 3);  // 4 collectives x sizes 1K, 4K, 16K
  EXPECT_EQ(ok, rows);
}

}  // namespace
