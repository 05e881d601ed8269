// What the front ends for operators (the console, the HTTP server) ask of a
// node or a controller: one admin command in the console's words
// (docs/console.md), answered with one JSON object as text. Both the node
// and the controller answer it; the front ends know nothing else of them.
#pragma once

#include <caf/all.hpp>

#include <string>
#include <vector>

namespace dsec {

using admin_atom = caf::atom_constant<caf::atom("admin")>;
using admin_actor =
    caf::typed_actor<caf::replies_to<admin_atom, std::string, std::vector<std::string>>::with<std::string>>;

}  // namespace dsec
