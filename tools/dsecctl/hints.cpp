// What dsecctl says when its command line is wrong, beyond CLI11's own
// message: the unknown word and the nearest command, and where a sandbox's
// command goes (after --). See cli.hpp.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "tools/dsecctl/cli.hpp"

namespace dsec::ctl {
namespace {

// Edits from a to b: insert, delete, replace, or swap two neighbours.
size_t Distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

std::vector<std::string> Names(CLI::App* app) {
  std::vector<std::string> names;
  for (auto* sub : app->get_subcommands([](CLI::App*) { return true; })) names.push_back(sub->get_name());
  return names;
}

// Whether `arg` (an option of `app` or of its parents) takes a value in the
// next word.
bool TakesValue(CLI::App* app, const std::string& arg) {
  if (arg.find('=') != std::string::npos) return false;
  for (CLI::App* a = app; a; a = a->get_parent()) {
    const CLI::Option* opt = a->get_option_no_throw(arg);
    if (opt) return opt->get_type_size_max() > 0;
  }
  return false;
}

}  // namespace

bool ExplainBadCommandLine(CLI::App* app, int argc, char** argv) {
  CLI::App* at = app;
  std::string path = "dsecctl";
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") break;
    if (!arg.empty() && arg[0] == '-') {
      if (TakesValue(at, arg)) ++i;
      continue;
    }
    auto names = Names(at);
    if (names.empty()) break;  // a command's own arguments from here on
    if (std::find(names.begin(), names.end(), arg) != names.end()) {
      at = at->get_subcommand(arg);
      path += " " + arg;
      continue;
    }
    // The nearest: at most two edits away (a swap of neighbours is one),
    // the same length first on a tie; else one it begins.
    std::string best;
    size_t best_d = 3, best_len = 0;
    for (const auto& n : names) {
      size_t d = Distance(arg, n);
      size_t len = n.size() > arg.size() ? n.size() - arg.size() : arg.size() - n.size();
      if (d < best_d || (d == best_d && len < best_len)) best = n, best_d = d, best_len = len;
    }
    for (const auto& n : names)
      if (best.empty() && arg.size() >= 2 && n.rfind(arg, 0) == 0) best = n;
    std::string all;
    for (const auto& n : names) all += (all.empty() ? "" : ", ") + n;
    std::fprintf(stderr, "dsecctl: '%s' is not a command of %s%s; its commands: %s (%s --help)\n", arg.c_str(),
                 path.c_str(), best.empty() ? "" : ("; did you mean '" + best + "'?").c_str(), all.c_str(),
                 path.c_str());
    return true;
  }
  return false;
}

void HintAfterParseError(const CLI::ParseError& e, int argc, char** argv) {
  if (e.get_exit_code() != static_cast<int>(CLI::ExitCodes::ExtrasError)) return;  // its name is the app's
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--") return;
  // Where the command went: the first command word of argv that takes one
  // (CLI11 forgets which subcommands it had parsed when it throws).
  std::string cmd;
  for (int i = 1; i < argc && cmd.empty(); ++i) {
    std::string arg = argv[i];
    if (arg == "run" || arg == "exec") cmd = arg;
    if (arg == "step" && i > 1 && std::string(argv[i - 1]) == "session") cmd = arg;
  }
  if (cmd.empty()) return;
  std::fprintf(stderr,
               "dsecctl: a word starting with '-' after the command is taken for one of dsecctl's flags; put the "
               "command after --, e.g. dsecctl %s%s -- python3 -c 'print(1)'\n",
               cmd == "step" ? "session step NAME INDEX" : cmd.c_str(), cmd == "exec" ? " ID" : "");
}

}  // namespace dsec::ctl
