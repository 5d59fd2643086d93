// The env table: one row per variable, each name once, and env_get / env_get_in refusing a
// name the table does not list (a read without a row is a bug, not a silent nullptr).
#include "core/env.h"
#include "core/error.h"

#include <doctest/doctest.h>

#include <cstdlib>
#include <map>
#include <set>
#include <string>

using namespace dtrain;

TEST_CASE("every env table row has a name, a reader and a meaning, and no name is listed twice") {
  std::set<std::string> seen;
  for (const EnvVar& v : env_table()) {
    CAPTURE(v.name);
    REQUIRE(v.name != nullptr);
    CHECK(seen.insert(v.name).second);
    CHECK(std::string(v.reader) != "");
    CHECK(std::string(v.meaning) != "");
    CHECK(env_find(v.name) == &v);
    CHECK(std::string(env_kind_name(v.kind)) != "?");
  }
  CHECK(env_find("DTRAIN_NO_SUCH_VARIABLE") == nullptr);
}

TEST_CASE("env_get reads a listed variable and refuses an unlisted one") {
  ::setenv("DTRAIN_SEED", "7", 1);
  CHECK(std::string(env_get("DTRAIN_SEED")) == "7");
  ::unsetenv("DTRAIN_SEED");
  CHECK(env_get("DTRAIN_SEED") == nullptr);
  ::setenv("DTRAIN_NOT_IN_TABLE", "1", 1);
  try {
    env_get("DTRAIN_NOT_IN_TABLE");
    FAIL("no throw");
  } catch (const InternalError& e) {
    CHECK(std::string(e.what()).find("DTRAIN_NOT_IN_TABLE is read but not in the env table") != std::string::npos);
  }
  // A name the user chose at run time (DTRAIN_WORKER_PRINT_ENV's list) is read as given.
  CHECK(std::string(env_get_user_named("DTRAIN_NOT_IN_TABLE")) == "1");
  ::unsetenv("DTRAIN_NOT_IN_TABLE");
}

TEST_CASE("the test hooks and other programs' variables are marked as such") {
  for (const char* n :
       {"DTRAIN_TEST_STALL_AT_STEP", "DTRAIN_TEST_STALL_RANK", "DTRAIN_TEST_SLOW_RANK", "DTRAIN_TEST_SLOW_MS"}) {
    CAPTURE(n);
    REQUIRE(env_find(n) != nullptr);
    CHECK(env_find(n)->kind == EnvKind::TEST_HOOK);
  }
  for (const char* n : {"HOME", "USER", "SSH_AUTH_SOCK", "CUDA_VISIBLE_DEVICES", "OPENBLAS_CORETYPE"}) {
    CAPTURE(n);
    REQUIRE(env_find(n) != nullptr);
    CHECK(env_find(n)->kind == EnvKind::EXTERNAL);
  }
}

TEST_CASE("env_get_in reads a listed variable from an environment snapshot and refuses an unlisted one") {
  const std::map<std::string, std::string> env = {{"SLURM_PROCID", "3"}, {"DTRAIN_NOT_IN_TABLE", "1"}};
  CHECK(env_get_in(env, "SLURM_PROCID") == "3");
  CHECK(env_get_in(env, "PMI_RANK") == "");
  CHECK_THROWS_AS(env_get_in(env, "DTRAIN_NOT_IN_TABLE"), InternalError);
}
