// How supervised actors crash: an exception becomes the actor's exit reason
// (the supervisor sees it in its down_msg and restarts the actor from its
// checkpoint) and is logged with who crashed. Plus the test-only hook that
// injects such a crash.
#pragma once

#include <caf/all.hpp>
#include <spdlog/logger.h>

#include <exception>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>

namespace dsec {

// `last_words(what)` runs first, on the crashing actor: it may answer the
// requests it holds (CAF 0.17 drops a dead actor's promises unanswered).
template <class Self>
void ExitOnException(Self* self, std::shared_ptr<spdlog::logger> log, std::string who,
                     std::function<void(const std::string& what)> last_words = nullptr) {
  self->set_exception_handler([log, who, last_words](std::exception_ptr& e) -> caf::error {
    std::string what = "an exception that is not a std::exception";
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      what = ex.what();
    } catch (...) {
    }
    log->error("{}: crashed: {}", who, what);
    if (last_words) last_words(what);
    return caf::make_error(caf::sec::runtime_error, what);
  });
}

// Behind crash_atom: throws when the node runs with --test-hooks, else nothing.
inline void InjectCrash(bool test_hooks) {
  if (test_hooks) throw std::runtime_error("injected crash (test hook)");
}

}  // namespace dsec
