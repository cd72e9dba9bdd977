// SIGTERM/SIGINT handling for stop-safe runs: the handler only raises a flag; the trainer sees
// it between steps, saves a checkpoint and exits 0. A second signal while saving is ignored
// (SageMaker and Slurm send SIGTERM once, then SIGKILL after their grace period).
#pragma once

namespace mxtrain {

void install_stop_handlers();
bool stop_requested();
int stop_signal_number();    // the signal that asked to stop, 0 if none
void request_stop_for_test(int signal_number);
void clear_stop_request();

}  // namespace mxtrain
