#include "stoker/io/shard_gate.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

namespace stoker::io {
namespace {

namespace fs = std::filesystem;

std::string write_file(const std::string& name, size_t bytes) {
  const fs::path p =
      fs::temp_directory_path() / ("stoker_gate_" + std::to_string(::getpid()) + "_" + name);
  std::ofstream(p, std::ios::binary) << std::string(bytes, 'x');
  return p.string();
}

const auto always = [] { return true; };

TEST(ShardGate, AReaderWaitsUntilTheShardIsReadyAndTheFetcherSeesTheRequest) {
  ShardGate gate({"a.tar", "b.tar"}, {10, 20});
  const std::string b = write_file("b", 20);
  std::atomic<bool> got{false};
  std::thread reader([&] {
    auto file = gate.acquire(1, always);
    EXPECT_EQ(file->size(), 20u);
    got = true;
  });
  const auto requests = gate.wait_for_requests(5000);
  ASSERT_EQ(requests, std::vector<uint32_t>{1});
  EXPECT_FALSE(got);
  gate.ready(1, b);
  reader.join();
  EXPECT_TRUE(got);
  EXPECT_EQ(gate.stats().waits, 1);
  EXPECT_EQ(gate.stats().ready, 1);
  EXPECT_TRUE(gate.wait_for_requests(0).empty());
  fs::remove(b);
}

TEST(ShardGate, RequestsComeOldestWaitFirst) {
  ShardGate gate({"a.tar", "b.tar", "c.tar"}, {1, 1, 1});
  std::vector<std::thread> readers;
  for (uint32_t shard : {2u, 0u}) {
    readers.emplace_back([&gate, shard] {
      try {
        gate.acquire(shard, always);
      } catch (const Error&) {
      }
    });
    while (gate.stats().waits < (shard == 2 ? 1 : 2)) std::this_thread::yield();
  }
  EXPECT_EQ(gate.wait_for_requests(0), (std::vector<uint32_t>{2, 0}));
  gate.close();
  for (auto& t : readers) t.join();
}

TEST(ShardGate, AFileOfTheWrongSizeIsRefusedAndTheShardStaysAbsent) {
  ShardGate gate({"a.tar"}, {10});
  const std::string a = write_file("short", 9);
  try {
    gate.ready(0, a);
    FAIL() << "a 9-byte file accepted for a 10-byte shard";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIO);
    EXPECT_EQ(e.shard(), "a.tar");
    EXPECT_NE(std::string(e.what()).find("9 bytes"), std::string::npos) << e.what();
  }
  EXPECT_EQ(gate.peek(0), nullptr);
  fs::remove(a);
}

TEST(ShardGate, AFailedShardRaisesItsReasonInEveryReader) {
  ShardGate gate({"a.tar"}, {10});
  std::thread reader([&] {
    try {
      gate.acquire(0, always);
      ADD_FAILURE() << "acquire returned for a failed shard";
    } catch (const ShardUnavailableError& e) {
      EXPECT_EQ(e.reason(), "s3://bucket/a.tar: connection refused (5 tries)");
      EXPECT_EQ(e.shard(), "a.tar");
    }
  });
  gate.wait_for_requests(5000);
  gate.failed(0, "s3://bucket/a.tar: connection refused (5 tries)");
  reader.join();
  EXPECT_THROW(gate.acquire(0, always), ShardUnavailableError);
}

TEST(ShardGate, CloseAndKeepWaitingEndTheWait) {
  ShardGate gate({"a.tar"}, {10});
  std::atomic<bool> keep{true};
  std::thread abandoned([&] {
    try {
      gate.acquire(0, [&] { return keep.load(); });
      ADD_FAILURE() << "returned without the shard";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInternal);
    }
  });
  gate.wait_for_requests(5000);
  keep = false;
  abandoned.join();  // within ~50 ms: the reader checks keep_waiting while it waits

  std::thread closed([&] {
    try {
      gate.acquire(0, always);
      ADD_FAILURE() << "returned without the shard";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kIO);
    }
  });
  gate.wait_for_requests(5000);
  gate.close();
  closed.join();
}

TEST(ShardGate, AnEvictedShardStaysReadableByWhoHoldsItAndIsAwaitedAgain) {
  ShardGate gate({"a.tar"}, {4});
  const std::string a = write_file("evict", 4);
  gate.ready(0, a);
  auto held = gate.acquire(0, always);
  gate.evict(0);
  fs::remove(a);  // as the fetcher does once the gate dropped it
  std::vector<uint8_t> out;
  held->read(0, 4, out);  // the open descriptor keeps the data
  EXPECT_EQ(out, std::vector<uint8_t>(4, 'x'));
  EXPECT_EQ(gate.peek(0), nullptr);
  EXPECT_EQ(gate.stats().evicted, 1);
  std::atomic<bool> keep{true};
  std::thread again([&] { EXPECT_THROW(gate.acquire(0, [&] { return keep.load(); }), Error); });
  EXPECT_EQ(gate.wait_for_requests(5000), std::vector<uint32_t>{0});
  keep = false;
  again.join();
}

}  // namespace
}  // namespace stoker::io
