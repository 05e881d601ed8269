// How supervised actors crash: an exception becomes the actor's exit reason
// (the supervisor sees it in its down_msg and restarts the actor from its
// checkpoint) and is logged with who crashed. Plus the test-only hook that
// injects such a crash.
#pragma once

#include <caf/all.hpp>
#include <spdlog/logger.h>

#include <exception>
#include <memory>
#include <stdexcept>
#include <string>

namespace dsec {

template <class Self>
void ExitOnException(Self* self, std::shared_ptr<spdlog::logger> log, std::string who) {
  self->set_exception_handler([log, who](std::exception_ptr& e) -> caf::error {
    std::string what = "an exception that is not a std::exception";
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      what = ex.what();
    } catch (...) {
    }
    log->error("{}: crashed: {}", who, what);
    return caf::make_error(caf::sec::runtime_error, what);
  });
}

// Behind crash_atom: throws when the node runs with --test-hooks, else nothing.
inline void InjectCrash(bool test_hooks) {
  if (test_hooks) throw std::runtime_error("injected crash (test hook)");
}

}  // namespace dsec
