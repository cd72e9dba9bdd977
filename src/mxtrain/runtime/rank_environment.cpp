#include "mxtrain/runtime/rank_environment.hpp"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "mxtrain/core/error.hpp"
#include "mxtrain/runtime/sagemaker_paths.hpp"

namespace mxtrain::runtime {
namespace {

constexpr int kDefaultMasterPort = 29500;   // torchrun's default
constexpr int kSageMakerMasterPort = 7777;  // sagemaker-training-toolkit's torch_distributed runner

int parse_int(const std::string& name, const std::string& text) {
  size_t used = 0;
  int value = 0;
  try {
    value = std::stoi(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size())
    throw Error(ErrorKind::config, name + "='" + text + "' is not an integer",
                "fix the variable in the launcher's environment (or unset it)");
  return value;
}

std::optional<int> optional_int(const EnvironmentLookup& lookup, const std::string& name) {
  std::optional<std::string> text = lookup(name);
  if (!text || text->empty()) return std::nullopt;
  return parse_int(name, *text);
}

int int_or(const EnvironmentLookup& lookup, const std::string& name, int fallback) {
  return optional_int(lookup, name).value_or(fallback);
}

std::string text_or(const EnvironmentLookup& lookup, const std::string& name, const std::string& fallback) {
  std::optional<std::string> text = lookup(name);
  return text && !text->empty() ? *text : fallback;
}

bool present(const EnvironmentLookup& lookup, const std::string& name) {
  std::optional<std::string> text = lookup(name);
  return text && !text->empty();
}

// Rank fields consistent with each other; `origin` names the variables for the message.
void validate(const RankEnvironment& e, const std::string& origin) {
  auto fail = [&](const std::string& what) {
    throw Error(ErrorKind::config, what + " (" + origin + ")",
                "check how the ranks were started: every rank needs the same world size and a distinct rank "
                "below it (see docs/distributed.md)");
  };
  if (e.world_size < 1) fail(strf("world size %d is not positive", e.world_size));
  if (e.rank < 0 || e.rank >= e.world_size) fail(strf("rank %d is not in [0, %d)", e.rank, e.world_size));
  if (e.local_world_size < 1 || e.local_world_size > e.world_size)
    fail(strf("local world size %d is not in [1, %d]", e.local_world_size, e.world_size));
  if (e.local_rank < 0 || e.local_rank >= e.local_world_size)
    fail(strf("local rank %d is not in [0, %d)", e.local_rank, e.local_world_size));
  if (e.node_rank < 0 || e.node_rank >= e.nodes) fail(strf("node rank %d is not in [0, %d)", e.node_rank, e.nodes));
  if (e.master_port < 1 || e.master_port > 65535) fail(strf("master port %d is not a TCP port", e.master_port));
}

// Lightning's guard: SLURM_* also describe the allocation inside an sbatch script or salloc
// shell, where no srun started this process.
bool started_by_srun(const EnvironmentLookup& lookup) {
  if (!present(lookup, "SLURM_PROCID") || !present(lookup, "SLURM_NTASKS")) return false;
  const std::string job_name = text_or(lookup, "SLURM_JOB_NAME", "");
  return job_name != "bash" && job_name != "interactive";
}

RankEnvironment from_slurm(const EnvironmentLookup& lookup) {
  RankEnvironment e;
  e.source = EnvironmentSource::slurm;
  e.rank = int_or(lookup, "SLURM_PROCID", 0);
  e.world_size = int_or(lookup, "SLURM_NTASKS", 1);
  e.local_rank = int_or(lookup, "SLURM_LOCALID", 0);
  e.node_rank = int_or(lookup, "SLURM_NODEID", 0);
  std::string nodelist = text_or(lookup, "SLURM_STEP_NODELIST", text_or(lookup, "SLURM_JOB_NODELIST",
                                                                         text_or(lookup, "SLURM_NODELIST", "")));
  if (!nodelist.empty()) e.hosts = expand_slurm_nodelist(nodelist);
  e.nodes = int_or(lookup, "SLURM_NNODES", e.hosts.empty() ? 1 : static_cast<int>(e.hosts.size()));
  if (std::optional<int> per_node = optional_int(lookup, "SLURM_NTASKS_PER_NODE")) {
    e.local_world_size = *per_node;
  } else {
    std::string tasks = text_or(lookup, "SLURM_STEP_TASKS_PER_NODE", text_or(lookup, "SLURM_TASKS_PER_NODE", ""));
    std::vector<int> counts = tasks.empty() ? std::vector<int>{} : expand_slurm_tasks_per_node(tasks);
    if (static_cast<size_t>(e.node_rank) < counts.size()) {
      e.local_world_size = counts[static_cast<size_t>(e.node_rank)];
    } else {
      e.local_world_size = e.nodes > 0 && e.world_size % e.nodes == 0 ? e.world_size / e.nodes : e.world_size;
    }
  }
  e.master_addr = text_or(lookup, "MASTER_ADDR", e.hosts.empty() ? "127.0.0.1" : e.hosts.front());
  int default_port = 12910;
  if (std::optional<std::string> job = lookup("SLURM_JOB_ID"); job && !job->empty()) {
    std::string digits = job->size() > 4 ? job->substr(job->size() - 4) : *job;
    default_port = 15000 + parse_int("SLURM_JOB_ID", digits);
  }
  e.master_port = int_or(lookup, "MASTER_PORT", default_port);
  validate(e, "Slurm: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID, SLURM_NNODES, tasks per node");
  return e;
}

RankEnvironment from_sagemaker(const EnvironmentLookup& lookup, const std::string& config_path, int visible_gpus) {
  RankEnvironment e;
  e.source = EnvironmentSource::sagemaker;
  e.node_level_only = true;
  std::string current = text_or(lookup, "SM_CURRENT_HOST", "");
  e.network_interface = text_or(lookup, "SM_NETWORK_INTERFACE_NAME", "");
  std::error_code error;
  if (std::filesystem::exists(config_path, error)) {
    nlohmann::json config;
    try {
      std::ifstream in(config_path);
      config = nlohmann::json::parse(in);
      current = config.value("current_host", current);
      e.hosts = config.at("hosts").get<std::vector<std::string>>();
      e.network_interface = config.value("network_interface_name", e.network_interface);
    } catch (const nlohmann::json::exception& parse_error) {
      throw Error(ErrorKind::config, config_path + " is not a SageMaker resource config: " + parse_error.what(),
                  "it needs \"current_host\" and \"hosts\"; set SM_INPUT_CONFIG_DIR (or MXTRAIN_SAGEMAKER_ROOT) to the "
                  "folder that holds it");
    }
  } else {
    try {
      e.hosts = nlohmann::json::parse(text_or(lookup, "SM_HOSTS", "[]")).get<std::vector<std::string>>();
    } catch (const nlohmann::json::exception& parse_error) {
      throw Error(ErrorKind::config, std::string("SM_HOSTS is not a JSON list of host names: ") + parse_error.what(),
                  "SM_HOSTS looks like [\"algo-1\",\"algo-2\"]");
    }
  }
  size_t index = e.hosts.size();
  for (size_t i = 0; i < e.hosts.size(); ++i)
    if (e.hosts[i] == current) index = i;
  if (index == e.hosts.size())
    throw Error(ErrorKind::config, "SageMaker's current host '" + current + "' is not among its hosts",
                "check resourceconfig.json (current_host, hosts) or SM_CURRENT_HOST and SM_HOSTS");
  e.nodes = static_cast<int>(e.hosts.size());
  e.node_rank = static_cast<int>(index);
  e.local_world_size = std::max(1, int_or(lookup, "SM_NUM_GPUS", visible_gpus));
  e.local_rank = 0;
  e.world_size = e.nodes * e.local_world_size;
  e.rank = e.node_rank * e.local_world_size;
  e.master_addr = e.hosts.front();
  e.master_port = int_or(lookup, "MASTER_PORT", kSageMakerMasterPort);
  validate(e, "SageMaker: resourceconfig.json or SM_HOSTS, SM_CURRENT_HOST, SM_NUM_GPUS");
  return e;
}

}  // namespace

const char* environment_source_name(EnvironmentSource source) {
  switch (source) {
    case EnvironmentSource::command_line: return "the command line";
    case EnvironmentSource::torchrun: return "torchrun variables";
    case EnvironmentSource::slurm: return "Slurm";
    case EnvironmentSource::open_mpi: return "Open MPI";
    case EnvironmentSource::pmi: return "PMI";
    case EnvironmentSource::sagemaker: return "SageMaker";
    case EnvironmentSource::single: return "a single process";
  }
  return "?";
}

std::string RankEnvironment::describe() const {
  return strf("rank %d of %d (local %d of %d, node %d of %d) from %s; master %s:%d", rank, world_size, local_rank,
              local_world_size, node_rank, nodes, environment_source_name(source), master_addr.c_str(), master_port);
}

EnvironmentLookup process_environment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (!value) return std::nullopt;
    return std::string(value);
  };
}

RankEnvironment resolve_rank_environment(const ExplicitRank& cli, const EnvironmentLookup& lookup, int visible_gpus) {
  RankEnvironment e;
  if (cli.any()) {
    if (cli.rank < 0 || cli.world_size < 0)
      throw Error(ErrorKind::config, "--rank and --world-size must be given together",
                  "give both (and --master-addr/--master-port for more than one node), or neither");
    e.source = EnvironmentSource::command_line;
    e.rank = cli.rank;
    e.world_size = cli.world_size;
    e.local_world_size = cli.local_world_size >= 0 ? cli.local_world_size : cli.world_size;
    e.local_rank = cli.local_rank >= 0 ? cli.local_rank : cli.rank % e.local_world_size;
    e.nodes = (e.world_size + e.local_world_size - 1) / std::max(1, e.local_world_size);
    e.node_rank = e.rank / std::max(1, e.local_world_size);
    e.master_addr = !cli.master_addr.empty() ? cli.master_addr : text_or(lookup, "MASTER_ADDR", e.master_addr);
    e.master_port = cli.master_port >= 0 ? cli.master_port : int_or(lookup, "MASTER_PORT", kDefaultMasterPort);
    validate(e, "--rank, --world-size, --local-rank, --local-world-size");
    return e;
  }
  if (present(lookup, "RANK") && present(lookup, "WORLD_SIZE")) {
    e.source = EnvironmentSource::torchrun;
    e.rank = int_or(lookup, "RANK", 0);
    e.world_size = int_or(lookup, "WORLD_SIZE", 1);
    e.local_world_size = int_or(lookup, "LOCAL_WORLD_SIZE", e.world_size);
    e.local_rank = int_or(lookup, "LOCAL_RANK", e.rank % std::max(1, e.local_world_size));
    e.nodes = (e.world_size + e.local_world_size - 1) / std::max(1, e.local_world_size);
    e.node_rank = int_or(lookup, "GROUP_RANK", e.rank / std::max(1, e.local_world_size));
    e.master_addr = text_or(lookup, "MASTER_ADDR", e.master_addr);
    e.master_port = int_or(lookup, "MASTER_PORT", kDefaultMasterPort);
    validate(e, "torchrun: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_PORT");
    return e;
  }
  if (started_by_srun(lookup)) return from_slurm(lookup);
  const bool open_mpi = present(lookup, "OMPI_COMM_WORLD_RANK") && present(lookup, "OMPI_COMM_WORLD_SIZE");
  const bool pmi = present(lookup, "PMI_RANK") && present(lookup, "PMI_SIZE");
  if (open_mpi || pmi) {
    e.source = open_mpi ? EnvironmentSource::open_mpi : EnvironmentSource::pmi;
    const std::string prefix = open_mpi ? "OMPI_COMM_WORLD_" : "PMI_";
    e.rank = int_or(lookup, prefix + "RANK", 0);
    e.world_size = int_or(lookup, prefix + "SIZE", 1);
    // Open MPI names the node-local values; Hydra (MPICH, Intel MPI) uses MPI_LOCALRANKID.
    e.local_rank = open_mpi ? int_or(lookup, "OMPI_COMM_WORLD_LOCAL_RANK", e.rank)
                            : int_or(lookup, "MPI_LOCALRANKID", e.rank);
    e.local_world_size = open_mpi ? int_or(lookup, "OMPI_COMM_WORLD_LOCAL_SIZE", e.world_size)
                                  : int_or(lookup, "MPI_LOCALNRANKS", e.world_size);
    e.nodes = (e.world_size + e.local_world_size - 1) / std::max(1, e.local_world_size);
    e.node_rank = e.rank / std::max(1, e.local_world_size);
    e.master_addr = text_or(lookup, "MASTER_ADDR", e.master_addr);
    e.master_port = int_or(lookup, "MASTER_PORT", kDefaultMasterPort);
    validate(e, open_mpi ? "Open MPI: OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE"
                         : "PMI: PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS");
    return e;
  }
  const std::string resource_config = sagemaker_paths(lookup).resource_config_file();
  std::error_code error;
  if (std::filesystem::exists(resource_config, error) ||
      (present(lookup, "SM_HOSTS") && present(lookup, "SM_CURRENT_HOST")))
    return from_sagemaker(lookup, resource_config, visible_gpus);
  e.master_addr = text_or(lookup, "MASTER_ADDR", e.master_addr);
  e.master_port = int_or(lookup, "MASTER_PORT", kDefaultMasterPort);
  return e;
}

std::vector<std::string> expand_slurm_nodelist(const std::string& list) {
  // Split at top-level commas (commas inside [...] belong to a range list).
  std::vector<std::string> items;
  int depth = 0;
  std::string current;
  for (char c : list) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (c == ',' && depth == 0) {
      if (!current.empty()) items.push_back(current);
      current.clear();
    } else {
      current += c;
    }
  }
  if (depth != 0)
    throw Error(ErrorKind::config, "Slurm node list '" + list + "' has unbalanced brackets",
                "check SLURM_JOB_NODELIST / SLURM_STEP_NODELIST");
  if (!current.empty()) items.push_back(current);

  std::vector<std::string> hosts;
  for (const std::string& item : items) {
    const size_t open = item.find('[');
    if (open == std::string::npos) {
      hosts.push_back(item);
      continue;
    }
    const size_t close = item.find(']', open);
    const std::string prefix = item.substr(0, open);
    const std::string ranges = item.substr(open + 1, close - open - 1);
    const std::string rest = item.substr(close + 1);
    // The rest may hold further brackets ("rack[1-2]-n[1-2]"): expand it recursively.
    std::vector<std::string> suffixes = rest.empty() ? std::vector<std::string>{""} : expand_slurm_nodelist(rest);
    size_t start = 0;
    while (start <= ranges.size()) {
      size_t comma = ranges.find(',', start);
      std::string range = ranges.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      start = comma == std::string::npos ? ranges.size() + 1 : comma + 1;
      if (range.empty()) continue;
      const size_t dash = range.find('-');
      const std::string first = range.substr(0, dash);
      const std::string last = dash == std::string::npos ? first : range.substr(dash + 1);
      const int low = parse_int("Slurm node list " + list, first);
      const int high = parse_int("Slurm node list " + list, last);
      const int width = static_cast<int>(first.size());
      for (int value = low; value <= high; ++value)
        for (const std::string& suffix : suffixes) hosts.push_back(prefix + strf("%0*d", width, value) + suffix);
    }
  }
  return hosts;
}

std::vector<int> expand_slurm_tasks_per_node(const std::string& text) {
  std::vector<int> counts;
  size_t start = 0;
  while (start < text.size()) {
    size_t comma = text.find(',', start);
    std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    start = comma == std::string::npos ? text.size() : comma + 1;
    int repeat = 1;
    const size_t paren = item.find("(x");
    if (paren != std::string::npos) {
      repeat = parse_int("Slurm tasks per node " + text, item.substr(paren + 2, item.find(')', paren) - paren - 2));
      item = item.substr(0, paren);
    }
    const int count = parse_int("Slurm tasks per node " + text, item);
    for (int i = 0; i < repeat; ++i) counts.push_back(count);
  }
  return counts;
}

int local_device_index(const RankEnvironment& environment, int visible_gpus) {
  if (visible_gpus == 1) return 0;
  if (environment.local_rank >= visible_gpus)
    throw Error(ErrorKind::config,
                strf("local rank %d needs GPU %d but this node shows %d GPU(s)", environment.local_rank,
                     environment.local_rank, visible_gpus),
                "start at most one rank per GPU on each node (--nproc-per-node, --ntasks-per-node) and check "
                "CUDA_VISIBLE_DEVICES");
  return environment.local_rank;
}

}  // namespace mxtrain::runtime
