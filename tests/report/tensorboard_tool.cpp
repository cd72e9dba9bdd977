// A test tool over mxtrain's TensorBoard writer, for tests/report/tensorboard_reference.py:
//   tensorboard_tool DIR POINTS.json   POINTS.json is [[tag, step, value, wall_time], ...];
//                                      writes them into one new event file in DIR, prints its path.
#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "mxtrain/core/error.hpp"
#include "mxtrain/report/tensorboard.hpp"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: tensorboard_tool DIR POINTS.json\n");
    return 2;
  }
  try {
    std::ifstream in(argv[2]);
    const nlohmann::json points = nlohmann::json::parse(in);
    mxtrain::TensorBoardWriter writer(argv[1]);
    for (const nlohmann::json& point : points)
      writer.add_scalar(point[0].get<std::string>(), point[1].get<int64_t>(), point[2].get<double>(),
                        point[3].get<double>());
    writer.flush();
    std::puts(writer.path().c_str());
    return 0;
  } catch (const mxtrain::Error& error) {
    std::fprintf(stderr, "%s\n", error.full_message().c_str());
    return 1;
  }
}
