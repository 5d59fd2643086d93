// The environment table: every variable dtrain reads, once, with who reads it and what it
// means, and its readers (env_get, env_get_in) that refuse a name the table does not list.
// Config (the schema's env overrides and knobs) is checked against it; --help-config prints it.
// C++17 and free of fmt: kernels/ (nvcc) reads through it too.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain {

enum class EnvKind {
  KEY,        // overrides a config key (meaning = the key's path)
  KNOB,       // a tunable without a YAML key (config's schema_env_knobs: type and default)
  CONTRACT,   // set by dtrain itself for the processes it starts (launcher -> agent -> rank)
  PLATFORM,   // set by the platform that started `dtrain run` (torchrun, Kubernetes, Slurm, mpirun)
  TEST_HOOK,  // test-only fault injection, read by the worker's test seam alone
  EXTERNAL,   // another program's variable dtrain consults (the shell, SSH, CUDA, OpenMP)
};

struct EnvVar {
  const char* name;
  EnvKind kind;
  const char* reader;   // the code that reads it
  const char* meaning;  // KEY: the config key it overrides; otherwise what it does
};

/// Every variable, grouped by kind.
const std::vector<EnvVar>& env_table();
/// The row for name, or nullptr.
const EnvVar* env_find(std::string_view name);
/// "overrides a config key", "knob", "dtrain's own (launcher -> rank)", ...
const char* env_kind_name(EnvKind kind);

/// getenv(name) for a name the table lists (nullptr when unset); InternalError for any
/// other name: a variable read without a row is a bug.
const char* env_get(std::string_view name);
/// A listed variable's value in a snapshot of the environment (launch::environ_map(), or
/// a test's map), "" when it is not there; InternalError for a name the table does not list.
std::string env_get_in(const std::map<std::string, std::string>& env, std::string_view name);
/// getenv for a name given at run time (DTRAIN_WORKER_PRINT_ENV's list, which names any
/// variable the user wants to see), which no table can list.
const char* env_get_user_named(std::string_view name);

}  // namespace dtrain
