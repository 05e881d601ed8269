// The node's supervisor: a sandbox or session actor that ended abnormally
// is restarted from its checkpoint, at most max_restarts times within the
// restart window (then its record is left failed, and an actor still
// answers for it). It decides and writes the record; the router spawns the
// actor it returns and puts it in its directory.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>

#include "actors/node/context.hpp"
#include "actors/node/supervision.hpp"
#include "dsec/store/v1/records.pb.h"
#include "wire/wire.hpp"

namespace dsec {

class Supervisor {
 public:
  explicit Supervisor(std::shared_ptr<NodeContext> ctx);

  // The record to restart sandbox `id` from after its actor died with
  // `why` (its restart count raised, or failed when it died too often), or
  // nullopt: it has no checkpoint and stays down.
  std::optional<store::v1::SandboxRow> SandboxDied(const std::string& id, const std::string& why);
  std::optional<v1::SessionRecord> SessionDied(const std::string& name, const std::string& why);
  // The child ended normally (or was destroyed): its history goes.
  void SandboxEnded(const std::string& id);
  void SessionEnded(const std::string& name);

  uint64_t restarts() const { return restarts_; }  // children restarted
  uint64_t gave_up() const { return gave_up_; }    // children left failed

 private:
  template <class Row>
  std::optional<Row> Died(const std::string& tag, const std::string& key, const std::string& why);

  std::shared_ptr<NodeContext> ctx_;
  RestartIntensity intensity_;
  // Restarts of a child ("sb/<id>", "se/<name>") as last counted: its
  // checkpoint may not have the last count yet when it crashes again.
  std::unordered_map<std::string, uint32_t> counts_;
  uint64_t restarts_ = 0;
  uint64_t gave_up_ = 0;
};

}  // namespace dsec
