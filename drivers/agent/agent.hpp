// dsec-agent: the in-sandbox agent. A small, statically linked,
// single-threaded process that is PID 1 of a container (later the init of a
// VM). It serves drivers/agent/agent.proto over length-prefixed frames on a
// unix socket (--listen) or on one already-connected stream fd (--fd, for a
// virtio-serial port), runs commands as its own children, streams their
// output, reads and writes files, and reaps every zombie in the sandbox.
// Because it, not dsecd, is the parent of the sandbox's processes, the
// sandbox keeps running while dsecd restarts.
#pragma once

#include <string>
#include <vector>

namespace dsec::agent {

struct AgentOptions {
  // Unix stream socket to create (mode 0600) and accept connections on; a
  // stale socket at the path is replaced. Empty: none.
  std::string listen_path;
  // An already-listening unix socket to accept on (a container's init binds
  // it while it still may, then makes its directory read-only). -1: none.
  int listen_fd = -1;
  // An already-connected stream fd to serve (socketpair end, virtio-serial
  // port). -1: none. At least one of listen_path / listen_fd / fd is required.
  int fd = -1;
  // `fd` is the guest end of a virtio-serial port (a microVM's or VM's
  // agent channel): it outlives its host side. A host going away (EOF,
  // hang-up) ends the conversation, not the agent, and each conversation
  // starts with the sync of channel_sync.hpp.
  bool vport = false;
  // memory.events of the cgroup the agent and its programs are in (a VM's
  // guest): an exec killed by a signal while its oom_kill count grew is
  // reported OOM-killed. Empty: not reported (the host's cgroup tells).
  std::string oom_events;
  // A cgroup v2 group (a VM's guest: /sys/fs/cgroup/sandbox) every program
  // joins before it runs, while the agent stays outside it: a sandbox that
  // fills its memory limit cannot starve the agent. Implies oom_events =
  // <cgroup>/memory.events. Empty: programs stay in the agent's group.
  std::string cgroup;
  // Written "ready\n" and closed once the agent serves requests (the socket
  // is listening). -1: none.
  int ready_fd = -1;
  // A guarded task's VM guest (its init's dsec.guard=1): programs run with
  // only container::kContainerCaps in their bounding set, so root in them
  // cannot unmount the guard's read-only binds, open the image's disk raw
  // or make a node for it.
  bool guarded = false;
  // A VM guest's overlay layers, which its init gives the agent alone as
  // descriptors (--layers-fd UPPER,IMAGE[,MASK]): what Changes reads, as
  // /proc/self/fd/N paths. Empty: no Changes here.
  std::string layer_upper;
  std::vector<std::string> layer_lowers;  // the mask first, then the image
};

// Runs until SIGTERM/SIGINT (ignored when PID 1), or until the --fd
// connection closes when there is no listening socket and we are not PID 1.
// Returns the process exit code.
int RunAgent(const AgentOptions& options);

}  // namespace dsec::agent
