// The schema against core's env table: every key's env override and every env knob has its
// row (KEY rows name the key they override, KNOB rows give the knob its help), and every KEY
// and KNOB row has its schema entry; --help-config (and so docs/config-reference.md) lists
// every row.
#include "config/schema.h"
#include "config/train_config.h"
#include "core/env.h"

#include <doctest/doctest.h>

#include <string>

using namespace dtrain;
using namespace dtrain::config;

TEST_CASE("every schema env override and env knob is in the env table, and every KEY and KNOB row in the schema") {
  for (const KeySpec& k : schema_keys()) {
    if (!k.env) continue;
    CAPTURE(k.env);
    const EnvVar* v = env_find(k.env);
    REQUIRE(v != nullptr);
    CHECK(v->kind == EnvKind::KEY);
    CHECK(std::string(v->meaning) == k.path);
  }
  for (const KeySpec& k : schema_env_knobs()) {
    CAPTURE(k.env);
    const EnvVar* v = env_find(k.env);
    REQUIRE(v != nullptr);
    CHECK(v->kind == EnvKind::KNOB);
    CHECK(std::string(v->meaning) == k.help);
  }
  for (const EnvVar& v : env_table()) {
    CAPTURE(v.name);
    if (v.kind == EnvKind::KEY) {
      const KeySpec* k = schema_find(v.meaning);
      REQUIRE(k != nullptr);
      REQUIRE(k->env != nullptr);
      CHECK(std::string(k->env) == v.name);
    } else if (v.kind == EnvKind::KNOB) {
      bool found = false;
      for (const KeySpec& k : schema_env_knobs()) found = found || std::string(k.env) == v.name;
      CHECK(found);
    }
  }
}

TEST_CASE("--help-config lists every variable of the env table with its reader") {
  const std::string help = config_help();
  for (const EnvVar& v : env_table()) {
    CAPTURE(v.name);
    CHECK(help.find(std::string("\n") + v.name + "\n    kind: " + env_kind_name(v.kind)) != std::string::npos);
    CHECK(help.find(std::string("    read by: ") + v.reader + "\n") != std::string::npos);
  }
}
