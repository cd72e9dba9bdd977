#include "mxtrain/runtime/tcp_rendezvous.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include "mxtrain/core/error.hpp"

namespace mxtrain::runtime {
namespace {

constexpr uint32_t kMagic = 0x4d585452;  // "MXTR"

using Clock = std::chrono::steady_clock;

class Socket {
 public:
  explicit Socket(int fd = -1) : fd_(fd) {}
  ~Socket() {
    if (fd_ >= 0) ::close(fd_);
  }
  Socket(Socket&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  Socket& operator=(Socket&& other) noexcept {
    std::swap(fd_, other.fd_);
    return *this;
  }
  int fd() const { return fd_; }

 private:
  int fd_;
};

double seconds_left(Clock::time_point deadline) {
  return std::chrono::duration<double>(deadline - Clock::now()).count();
}

// Sends or receives exactly `bytes`; false on a closed peer, error or timeout.
bool transfer(int fd, void* data, size_t bytes, bool send, Clock::time_point deadline) {
  char* cursor = static_cast<char*>(data);
  while (bytes > 0) {
    const double left = seconds_left(deadline);
    if (left <= 0) return false;
    pollfd poll_fd{fd, static_cast<short>(send ? POLLOUT : POLLIN), 0};
    const int ready = ::poll(&poll_fd, 1, static_cast<int>(std::min(left, 1.0) * 1000) + 1);
    if (ready < 0 && errno != EINTR) return false;
    if (ready <= 0) continue;
    const ssize_t done = send ? ::send(fd, cursor, bytes, MSG_NOSIGNAL) : ::recv(fd, cursor, bytes, 0);
    if (done < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (done <= 0) return false;
    cursor += done;
    bytes -= static_cast<size_t>(done);
  }
  return true;
}

std::string endpoint(const RankEnvironment& e) { return strf("%s:%d", e.master_addr.c_str(), e.master_port); }

Socket listen_on(int port, bool reuse) {
  Socket server(::socket(AF_INET, SOCK_STREAM, 0));
  if (server.fd() < 0) return Socket();
  int one = 1;
  if (reuse) ::setsockopt(server.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  address.sin_port = htons(static_cast<uint16_t>(port));
  if (::bind(server.fd(), reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) return Socket();
  if (::listen(server.fd(), 128) != 0) return Socket();
  return server;
}

std::string serve(const RankEnvironment& e, const std::string& payload, double timeout_s) {
  Socket server = listen_on(e.master_port, true);
  if (server.fd() < 0)
    throw Error(ErrorKind::system,
                strf("rank 0 cannot listen on port %d for the start-up handshake: %s", e.master_port,
                     std::strerror(errno)),
                "another job probably holds the port: choose a free one with --master-port (or MASTER_PORT)");
  const Clock::time_point deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                        std::chrono::duration<double>(timeout_s));
  std::vector<Socket> peers;
  std::set<int> joined;
  while (static_cast<int>(joined.size()) < e.world_size - 1) {
    const double left = seconds_left(deadline);
    if (left <= 0) {
      std::string missing;
      for (int r = 1; r < e.world_size; ++r)
        if (!joined.count(r)) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      throw Error(ErrorKind::system,
                  strf("ranks %s did not reach rank 0 at %s within %.0f s", missing.c_str(), endpoint(e).c_str(),
                       timeout_s),
                  "start every rank with the same world size, and make MASTER_ADDR (the first node's address) and "
                  "MASTER_PORT reachable from every node");
    }
    pollfd poll_fd{server.fd(), POLLIN, 0};
    if (::poll(&poll_fd, 1, static_cast<int>(std::min(left, 1.0) * 1000) + 1) <= 0) continue;
    Socket peer(::accept(server.fd(), nullptr, nullptr));
    if (peer.fd() < 0) continue;
    uint32_t hello[3] = {};
    if (!transfer(peer.fd(), hello, sizeof hello, false, deadline) || hello[0] != kMagic) continue;  // not ours
    const int rank = static_cast<int>(hello[1]), world = static_cast<int>(hello[2]);
    if (world != e.world_size)
      throw Error(ErrorKind::config,
                  strf("rank %d joined with a world size of %d, rank 0 has %d", rank, world, e.world_size),
                  "start every rank with the same WORLD_SIZE (launch --nnodes and --nproc-per-node must agree on "
                  "every node)");
    if (rank < 1 || rank >= e.world_size || !joined.insert(rank).second)
      throw Error(ErrorKind::config, strf("two processes claim rank %d", rank),
                  "give each process its own rank (check --node-rank on every node)");
    peers.push_back(std::move(peer));
  }
  const uint32_t length = static_cast<uint32_t>(payload.size());
  for (Socket& peer : peers) {
    std::string message(reinterpret_cast<const char*>(&length), sizeof length);
    message += payload;
    if (!transfer(peer.fd(), message.data(), message.size(), true, deadline))
      throw Error(ErrorKind::system, "a rank disconnected during the start-up handshake at " + endpoint(e),
                  "look for the failed rank's error; then restart the job");
  }
  return payload;
}

std::string join(const RankEnvironment& e, double timeout_s) {
  const Clock::time_point deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                        std::chrono::duration<double>(timeout_s));
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  std::string last_problem = "no answer";
  while (seconds_left(deadline) > 0) {
    addrinfo* found = nullptr;
    const std::string port = std::to_string(e.master_port);
    const int resolved = ::getaddrinfo(e.master_addr.c_str(), port.c_str(), &hints, &found);
    if (resolved != 0) {
      last_problem = std::string("cannot resolve the host: ") + ::gai_strerror(resolved);
    } else {
      Socket client(::socket(found->ai_family, found->ai_socktype, found->ai_protocol));
      const bool connected = client.fd() >= 0 && ::connect(client.fd(), found->ai_addr, found->ai_addrlen) == 0;
      if (!connected) last_problem = std::strerror(errno);
      ::freeaddrinfo(found);
      if (connected) {
        uint32_t hello[3] = {kMagic, static_cast<uint32_t>(e.rank), static_cast<uint32_t>(e.world_size)};
        uint32_t length = 0;
        if (transfer(client.fd(), hello, sizeof hello, true, deadline) &&
            transfer(client.fd(), &length, sizeof length, false, deadline)) {
          std::string payload(length, '\0');
          if (transfer(client.fd(), payload.data(), length, false, deadline)) return payload;
        }
        last_problem = "rank 0 closed the connection (it probably failed: see its log)";
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  throw Error(ErrorKind::system,
              strf("rank %d could not get the start-up handshake from rank 0 at %s within %.0f s (%s)", e.rank,
                   endpoint(e).c_str(), timeout_s, last_problem.c_str()),
              "check that rank 0 is running, that MASTER_ADDR names the first node and is reachable from this one, "
              "and that MASTER_PORT is open");
}

}  // namespace

std::string tcp_broadcast_from_rank0(const RankEnvironment& environment, const std::string& payload,
                                     double timeout_s) {
  if (environment.world_size == 1) return payload;
  return environment.rank == 0 ? serve(environment, payload, timeout_s) : join(environment, timeout_s);
}

bool tcp_port_is_free(int port) { return listen_on(port, true).fd() >= 0; }

}  // namespace mxtrain::runtime
