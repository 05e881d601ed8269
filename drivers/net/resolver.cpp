#include "drivers/net/resolver.hpp"

#include <arpa/inet.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>
#include <unordered_map>

#include "drivers/net/dns.hpp"
#include "runtime/metrics.hpp"
#include "runtime/unique_fd.hpp"

namespace dsec::net {

namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kNegativeTtl = std::chrono::seconds(10);
constexpr size_t kMaxWaiters = 64;  // clients waiting on one upstream query
constexpr size_t kMaxWaitingPerSandbox = 32;  // one sandbox cannot fill the pending table

std::string AddrText(const sockaddr_in& a) {
  char ip[INET_ADDRSTRLEN] = "?";
  ::inet_ntop(AF_INET, &a.sin_addr, ip, sizeof ip);
  return std::string(ip) + ":" + std::to_string(ntohs(a.sin_port));
}

}  // namespace

std::vector<sockaddr_in> NameserversOf(const std::string& text) {
  std::vector<sockaddr_in> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string key, addr;
    if (!(words >> key >> addr) || key != "nameserver") continue;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(53);
    if (::inet_pton(AF_INET, addr.c_str(), &a.sin_addr) == 1) out.push_back(a);
  }
  return out;
}

struct Resolver::Impl {
  ResolverOptions o;
  UniqueFd udp, tcp, stop;
  std::thread thread;

  struct Cached {
    std::vector<uint32_t> addrs;
    dns::Rcode rcode = dns::kNoError;
    Clock::time_point expires;
  };
  mutable std::mutex mu;  // the cache and the stats (Cached() and stats() read them from other threads)
  std::unordered_map<std::string, Cached> cache;
  Stats st;

  struct Waiter {
    sockaddr_in client;
    dns::Query q;
    std::string id;
    uint64_t gen = 0;
    std::vector<size_t> entries;  // the indexes of the name entries that list it
  };
  struct Pending {
    // Its own socket, connected to the server asked (a port of its own per
    // try: an off-path forger must guess the port as well as the id).
    UniqueFd sock;
    std::string name;
    Clock::time_point deadline;
    size_t tries = 0;
    std::vector<Waiter> waiters;
  };
  std::unordered_map<uint16_t, Pending> pending;  // by the upstream query's id
  std::unordered_map<std::string, size_t> waiting;  // queries waiting on the upstream, per sandbox
  void Unwait(const Pending& p) {
    for (const auto& w : p.waiters)
      if (--waiting[w.id] == 0) waiting.erase(w.id);
  }
  std::mt19937 rng{std::random_device{}()};

  void Log(int level, const std::string& text) const {
    if (o.log) o.log(level, text);
  }
  void Count(uint64_t Stats::*field) {
    static const std::pair<uint64_t Stats::*, const char*> kNames[] = {
        {&Stats::answered_cached, "answer=\"cached\""}, {&Stats::answered_upstream, "answer=\"upstream\""},
        {&Stats::nxdomain, "answer=\"nxdomain\""},      {&Stats::refused, "answer=\"refused\""},
        {&Stats::servfail, "answer=\"servfail\""}};
    for (const auto& [f, labels] : kNames)
      if (f == field) metrics::DnsAnswers().At(labels).Add();
    std::lock_guard<std::mutex> lk(mu);
    ++(st.*field);
  }
  void Send(const sockaddr_in& to, const std::vector<uint8_t>& msg) {
    (void)::sendto(udp.get(), msg.data(), msg.size(), 0, reinterpret_cast<const sockaddr*>(&to), sizeof to);
  }
  void Reply(const Waiter& w, dns::Rcode rcode, const std::vector<uint32_t>& addrs, uint32_t ttl) {
    if (rcode == dns::kNoError && !addrs.empty() && w.q.qtype == dns::kTypeA && o.pin)
      for (size_t i : w.entries) o.pin(w.id, w.gen, i, addrs, ttl);
    bool a = w.q.qtype == dns::kTypeA;
    Send(w.client, dns::Answer(w.q, rcode, a ? addrs : std::vector<uint32_t>{}, ttl));
  }

  void Run() {
    std::vector<uint8_t> buf(4096);
    for (;;) {
      int wait = -1;
      auto now = Clock::now();
      for (const auto& [qid, p] : pending) {
        int ms = static_cast<int>(
            std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::milliseconds>(p.deadline - now).count() + 1));
        wait = wait < 0 ? ms : std::min(wait, ms);
      }
      std::vector<pollfd> p = {{udp.get(), POLLIN, 0}, {tcp.get(), POLLIN, 0}, {stop.get(), POLLIN, 0}};
      std::vector<uint16_t> ids;
      for (const auto& [qid, q] : pending) {
        p.push_back({q.sock.get(), POLLIN, 0});
        ids.push_back(qid);
      }
      if (::poll(p.data(), p.size(), wait) < 0 && errno != EINTR) return;
      if (p[2].revents) return;
      if (p[1].revents) {
        int c = ::accept4(tcp.get(), nullptr, nullptr, SOCK_CLOEXEC);
        if (c >= 0) ::close(c);
      }
      if (p[0].revents) {
        sockaddr_in from{};
        socklen_t len = sizeof from;
        ssize_t n = ::recvfrom(udp.get(), buf.data(), buf.size(), 0, reinterpret_cast<sockaddr*>(&from), &len);
        if (n > 0) FromClient(from, buf.data(), static_cast<size_t>(n));
      }
      for (size_t i = 0; i < ids.size(); ++i) {
        if (!p[3 + i].revents) continue;
        auto it = pending.find(ids[i]);
        if (it == pending.end()) continue;  // answered earlier in this round
        // Connected: only the server asked gets through.
        ssize_t n = ::recv(it->second.sock.get(), buf.data(), buf.size(), 0);
        if (n > 0) FromUpstream(ids[i], buf.data(), static_cast<size_t>(n));
        else if (n < 0 && errno == ECONNREFUSED) it->second.deadline = Clock::now();  // no server there: the next try
      }
      Expire();
    }
  }

  void FromClient(const sockaddr_in& from, const uint8_t* data, size_t n) {
    auto q = dns::ParseQuery(data, n);
    if (!q) return;  // not a query: dropped, unanswered
    Count(&Stats::queries);
    Waiter w;
    w.client = from;
    w.q = std::move(*q);
    std::vector<Rule> rules;
    if (!o.who || !o.who(ntohl(from.sin_addr.s_addr), &w.id, &rules, &w.gen)) {
      Count(&Stats::refused);
      return Send(from, dns::Answer(w.q, dns::kRefused, {}, 0));
    }
    for (size_t i = 0; i < rules.size(); ++i)
      if (rules[i].is_name() && rules[i].MatchesName(w.q.name)) w.entries.push_back(i);
    if (w.entries.empty() || w.q.qclass != dns::kClassIn) {
      Count(&Stats::nxdomain);
      if (o.refused) o.refused(w.id, w.q.name);
      return Send(from, dns::Answer(w.q, dns::kNxDomain, {}, 0));
    }
    if (w.q.qtype != dns::kTypeA) return Send(from, dns::Answer(w.q, dns::kNoError, {}, 0));
    auto now = Clock::now();
    {
      std::unique_lock<std::mutex> lk(mu);
      auto it = cache.find(w.q.name);
      if (it != cache.end() && it->second.expires > now) {
        Cached c = it->second;
        lk.unlock();
        Count(&Stats::answered_cached);
        auto left = std::chrono::duration_cast<std::chrono::seconds>(c.expires - now).count() + 1;
        return Reply(w, c.rcode, c.addrs, static_cast<uint32_t>(left));
      }
    }
    if (waiting[w.id] >= kMaxWaitingPerSandbox) {
      Count(&Stats::servfail);
      return Send(from, dns::Answer(w.q, dns::kServFail, {}, 0));
    }
    for (auto& [qid, p] : pending)
      if (p.name == w.q.name) {
        if (p.waiters.size() >= kMaxWaiters) {
          Count(&Stats::servfail);
          return Send(from, dns::Answer(w.q, dns::kServFail, {}, 0));
        }
        ++waiting[w.id];
        p.waiters.push_back(std::move(w));
        return;
      }
    if (pending.size() >= o.max_pending || o.upstream.empty()) {
      Count(&Stats::servfail);
      if (o.upstream.empty()) Log(2, "sandbox DNS: no upstream resolver for " + w.q.name + " (dsecd --sandbox-dns-upstream)");
      return Send(from, dns::Answer(w.q, dns::kServFail, {}, 0));
    }
    uint16_t qid;
    do qid = static_cast<uint16_t>(rng()); while (pending.count(qid));
    Pending& p = pending[qid];
    p.name = w.q.name;
    ++waiting[w.id];
    p.waiters.push_back(std::move(w));
    Ask(qid, &p);
  }

  void Ask(uint16_t qid, Pending* p) {
    const sockaddr_in& to = o.upstream[(p->tries / 2) % o.upstream.size()];
    ++p->tries;
    p->deadline = Clock::now() + std::chrono::milliseconds(o.timeout_ms);
    p->sock = UniqueFd(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!p->sock || ::connect(p->sock.get(), reinterpret_cast<const sockaddr*>(&to), sizeof to) != 0) {
      p->deadline = Clock::now();  // tried again (or failed) at once by Expire
      return;
    }
    auto msg = dns::AQuery(qid, p->name);
    (void)::send(p->sock.get(), msg.data(), msg.size(), 0);
  }

  void FromUpstream(uint16_t qid, const uint8_t* data, size_t n) {
    auto r = dns::ParseResponse(data, n);
    if (!r || r->id != qid) return;
    auto it = pending.find(qid);
    if (it == pending.end() || it->second.name != r->name) return;
    Pending p = std::move(it->second);
    pending.erase(it);
    Unwait(p);
    dns::Rcode rcode = r->rcode == dns::kNxDomain ? dns::kNxDomain : r->rcode == dns::kNoError ? dns::kNoError
                                                                                            : dns::kServFail;
    uint32_t ttl = std::min(r->ttl, o.max_ttl_s);
    if (rcode != dns::kServFail) {
      auto life = rcode == dns::kNxDomain ? kNegativeTtl : std::chrono::seconds(ttl);
      Store(p.name, Cached{r->addrs, rcode, Clock::now() + life});
    }
    Count(rcode == dns::kServFail ? &Stats::servfail : &Stats::answered_upstream);
    for (const auto& w : p.waiters) Reply(w, rcode, r->addrs, std::max<uint32_t>(ttl, 1));
  }

  void Store(const std::string& name, Cached c) {
    std::lock_guard<std::mutex> lk(mu);
    if (cache.size() >= o.cache_names && !cache.count(name)) {
      auto now = Clock::now();
      for (auto it = cache.begin(); it != cache.end();) it = it->second.expires <= now ? cache.erase(it) : ++it;
      if (cache.size() >= o.cache_names)
        cache.erase(std::min_element(cache.begin(), cache.end(), [](const auto& a, const auto& b) {
          return a.second.expires < b.second.expires;
        }));
    }
    cache[name] = std::move(c);
  }

  void Expire() {
    auto now = Clock::now();
    for (auto it = pending.begin(); it != pending.end();) {
      Pending& p = it->second;
      if (p.deadline > now) {
        ++it;
        continue;
      }
      if (p.tries < 2 * o.upstream.size()) {
        Ask(it->first, &p);
        ++it;
        continue;
      }
      Log(2, "sandbox DNS: no answer for " + p.name + " from " + AddrText(o.upstream[0]) +
                 (o.upstream.size() > 1 ? " or the other upstreams" : "") + " (SERVFAIL to the sandbox)");
      Count(&Stats::servfail);
      for (const auto& w : p.waiters) Send(w.client, dns::Answer(w.q, dns::kServFail, {}, 0));
      Unwait(p);
      it = pending.erase(it);
    }
  }
};

Resolver::Resolver(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::unique_ptr<Resolver>> Resolver::Start(ResolverOptions options) {
  auto impl = std::make_unique<Impl>();
  impl->o = std::move(options);
  uint16_t port = impl->o.port;
  for (int type : {SOCK_DGRAM, SOCK_STREAM}) {
    UniqueFd fd(::socket(AF_INET, type | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    if (!fd || ::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        (type == SOCK_STREAM && ::listen(fd.get(), 16) != 0))
      return Status::FromErrno(errno, "sandbox networking: the resolver's port " + std::to_string(port) +
                                          (type == SOCK_DGRAM ? "/udp" : "/tcp") +
                                          " (in use? dsecd --sandbox-dns-port another)");
    (type == SOCK_DGRAM ? impl->udp : impl->tcp) = std::move(fd);
  }
  impl->stop = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!impl->stop) return Status::FromErrno(errno, "sandbox networking: the resolver's eventfd");
  Impl* p = impl.get();
  impl->thread = std::thread([p] { p->Run(); });
  return std::unique_ptr<Resolver>(new Resolver(std::move(impl)));
}

Resolver::~Resolver() {
  uint64_t one = 1;
  (void)!::write(impl_->stop.get(), &one, sizeof one);
  if (impl_->thread.joinable()) impl_->thread.join();
}

std::vector<std::pair<std::vector<uint32_t>, uint32_t>> Resolver::Cached(const Rule& rule) const {
  std::vector<std::pair<std::vector<uint32_t>, uint32_t>> out;
  auto now = Clock::now();
  std::lock_guard<std::mutex> lk(impl_->mu);
  for (const auto& [name, c] : impl_->cache)
    if (c.expires > now && c.rcode == dns::kNoError && !c.addrs.empty() && rule.MatchesName(name))
      out.push_back({c.addrs, static_cast<uint32_t>(
                                  std::chrono::duration_cast<std::chrono::seconds>(c.expires - now).count() + 1)});
  return out;
}

Resolver::Stats Resolver::stats() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->st;
}

}  // namespace dsec::net
