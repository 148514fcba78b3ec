// Per-command help: `trainctl <command> --help` (or `trainctl help
// <command>`) prints what the command does, its flags only (with their
// defaults and help text from the flag registry), and an example; `trainctl
// --help` prints the list of commands. Commands and flags are listed in
// help.cc, next to each other, so adding a flag to a command is one line.
#ifndef DTRAIN_SERVICES_TRAINCTL_HELP_H_
#define DTRAIN_SERVICES_TRAINCTL_HELP_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace dtrain {
namespace trainctl {

// The overview: one line per command and the flags every command takes.
std::string OverviewHelp();

// The help of `command` ("submit", "cluster", ...), or an empty string for
// an unknown command.
std::string CommandHelp(absl::string_view command);

// If argv asks for help (--help, -h, --helpfull, or `help [COMMAND]`),
// returns what to print (the command's help when argv names a known command,
// else the overview); otherwise returns an empty string. Call before
// absl::ParseCommandLine, which would print every flag of every command.
std::string HelpRequested(int argc, char** argv);

}  // namespace trainctl
}  // namespace dtrain

#endif  // DTRAIN_SERVICES_TRAINCTL_HELP_H_
