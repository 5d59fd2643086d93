// dtrain command line: parses arguments (CLI11), dispatches to lib/, and maps typed
// exceptions to process exit codes. The only place that catches dtrain::Error.
#include "core/error.h"
#include "core/log.h"
#include "core/version.h"

#include <CLI/CLI.hpp>

#include <cstdio>

int main(int argc, char** argv) {
  CLI::App app{"dtrain: distributed transformer training launcher and runner"};
  app.set_version_flag("--version", std::string("dtrain ") + dtrain::version());
  app.require_subcommand(1);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : static_cast<int>(dtrain::Exit::USAGE);
  }
  return 0;
}
