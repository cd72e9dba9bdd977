#include "mxtrain/train/stop_signal.hpp"

#include <atomic>
#include <csignal>

namespace mxtrain {
namespace {
// The only process-wide state besides the logger: a signal handler can reach nothing else.
std::atomic<int> g_stop_signal{0};

extern "C" void on_stop_signal(int signal_number) {
  int expected = 0;
  g_stop_signal.compare_exchange_strong(expected, signal_number);
}
}  // namespace

void install_stop_handlers() {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
}

bool stop_requested() { return g_stop_signal.load() != 0; }
int stop_signal_number() { return g_stop_signal.load(); }
void request_stop_for_test(int signal_number) { g_stop_signal = signal_number; }
void clear_stop_request() { g_stop_signal = 0; }

}  // namespace mxtrain
