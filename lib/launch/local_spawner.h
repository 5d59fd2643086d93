// The local spawner: fork/exec of a command in its own process group with its
// stdout/stderr read line by line on a reader thread and stdin kept open (the child
// sees EOF when the launcher dies), plus host_is_local() to pick local over SSH.
#pragma once

#include "launch/spawner.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace dtrain::launch {

/// How spawn_local builds the child's environment.
enum class EnvMode {
  INHERIT,  ///< the launcher's environment, with `env` added (overriding equal keys)
  REPLACE   ///< exactly `env`, nothing inherited
};

/// A local child process. pid() is also the process group id when it was spawned
/// with its own group.
class LocalProcess : public Process {
 public:
  virtual int pid() const = 0;
  /// The process group the child leads, or -1 when spawned without its own group.
  virtual int pgid() const = 0;
};

/// Starts argv (argv[0] searched in the PATH of the child's environment when it has
/// no '/') in `workdir` (empty: the launcher's cwd). `stdin_data` is written to the
/// child's stdin, which then stays open until close_stdin() or destruction, so a child
/// can treat stdin EOF as "the launcher is gone" (no PR_SET_PDEATHSIG is used: it fires
/// when the spawning *thread* exits, which would kill children of short-lived threads).
/// With own_process_group the child calls setpgid(0, 0) and terminate() signals the
/// whole group. Throws LaunchError (naming the command) when it cannot be started:
/// not found, not executable, bad workdir, or an env key/value that cannot be passed.
std::unique_ptr<LocalProcess> spawn_local(const std::vector<std::string>& argv,
                                          const std::map<std::string, std::string>& env, const std::string& workdir,
                                          const std::string& stdin_data, LineCallback callback,
                                          bool own_process_group = true, EnvMode env_mode = EnvMode::INHERIT);

/// Makes this process a child subreaper (prctl PR_SET_CHILD_SUBREAPER): descendants
/// orphaned inside a spawned process group are re-parented here, and the LocalProcess
/// of that group reaps them. Without it, orphans go to PID 1, which in some containers
/// never reaps them, so dead group members linger as zombies. Process-wide; meant for
/// the launcher and node-agent main()s (orphans outside every spawned group would then
/// stay zombies of this process until it exits).
void spawner_become_subreaper();

/// True for names that denote this machine: "localhost", 127.0.0.0/8, ::1, this
/// machine's hostname (short or as resolved) and any address of its own interfaces.
/// Accepts "user@host" (the user is ignored). Never throws; unresolvable names are
/// not local.
bool host_is_local(const std::string& host);

}  // namespace dtrain::launch
