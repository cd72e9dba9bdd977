#!/usr/bin/env python3
"""The Dockerfile without Docker (none here; docs/sagemaker.md says so): its pieces are checked.

1. The build stage builds the way the README does, `scripts/setup.sh`, with a CUDA preset of
   CMakePresets.json, and the runtime stage copies that preset's binary; both stages use the same
   CUDA image tag and distribution, so the copied libraries fit the runtime stage.
2. `docker run IMAGE train` is `mxtrain train`: an exec-form ENTRYPOINT on the copied binary.
3. scripts/copy_runtime_libs.sh, run here on the CPU build, copies exactly the libraries `ldd`
   resolves (parsed here independently) but the C library, the loader and the NVIDIA driver's,
   byte for byte, at their real directories, with Open MPI's plugins when libmpi is among them.
4. .dockerignore keeps host build trees out of the context and everything the build needs in it.

Usage: dockerfile_test.py MXTRAIN_BINARY SOURCE_DIR WORK_DIR
"""
import filecmp
import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
import sys

BINARY, SOURCE, WORK = sys.argv[1:4]
failures = []


def check(condition, message):
    if not condition:
        failures.append(message)
        print("FAIL:", message)


def read(path):
    return open(os.path.join(SOURCE, path), encoding="utf-8").read()


dockerfile = read("Dockerfile")
# Instructions with their continuation lines joined, comments dropped.
instructions = []
for line in re.sub(r"\\\n", " ", dockerfile).splitlines():
    if line.strip() and not line.lstrip().startswith("#"):
        instructions.append(line.strip())
arguments = {}
stages = []  # [(FROM image, [instructions])]
for instruction in instructions:
    keyword, _, rest = instruction.partition(" ")
    if keyword == "ARG" and not stages:
        name, _, value = rest.partition("=")
        arguments[name] = value
    elif keyword == "FROM":
        stages.append((rest, []))
    elif stages:
        stages[-1][1].append(instruction)
check(len(stages) == 2, f"expected a build and a runtime stage, found {len(stages)}")
(build_from, build), (runtime_from, runtime) = stages[0], stages[-1]


def expand(text):
    return re.sub(r"\$\{(\w+)\}", lambda m: arguments.get(m.group(1), m.group(0)), text)


build_image, runtime_image = expand(build_from.split()[0]), expand(runtime_from.split()[0])
check(build_from.split()[-1] == "build", "the first stage is not named build")
check(re.fullmatch(r"nvidia/cuda:[\w.]+-cudnn-devel-ubuntu[\d.]+", build_image) is not None,
      f"the build stage is not a CUDA devel image with cuDNN: {build_image}")
check(build_image.replace("-devel-", "-runtime-") == runtime_image,
      f"the stages use different CUDA images or distributions: {build_image} / {runtime_image}")

# 1. setup.sh with a CUDA preset, the README's entry point
presets = {p["name"]: p for p in json.loads(read("CMakePresets.json"))["configurePresets"]}
run_lines = [i[4:] for i in build if i.startswith("RUN ")]
setup = [re.search(r"MXTRAIN_PRESET=(\w+) \./scripts/setup\.sh", line) for line in run_lines]
setup = [m for m in setup if m]
check(len(setup) == 1, "the build stage does not run MXTRAIN_PRESET=... ./scripts/setup.sh once")
preset = setup[0].group(1) if setup else "?"
check(presets.get(preset, {}).get("cacheVariables", {}).get("MXTRAIN_CUDA") == "ON",
      f"preset {preset} is not a CUDA build in CMakePresets.json")
check("./scripts/setup.sh" in read("README.md"), "the README no longer starts with scripts/setup.sh")
built = f"build/{preset}/mxtrain"
check(any(f"./scripts/copy_runtime_libs.sh ./{built} /runtime-libs" in line for line in run_lines),
      f"the build stage does not collect {built}'s libraries with scripts/copy_runtime_libs.sh")
copies = [shlex.split(i) for i in runtime if i.startswith("COPY ")]
check(["COPY", "--from=build", "/runtime-libs/", "/"] in copies, "the runtime stage does not copy /runtime-libs/")
check(["COPY", "--from=build", f"/src/{built}", "/usr/local/bin/mxtrain"] in copies,
      f"the runtime stage does not copy /src/{built} to /usr/local/bin/mxtrain")
check(any(i.startswith("COPY . /src") for i in build) and "WORKDIR /src" in build,
      "the build stage does not build the context in /src")
setup_script = read("scripts/setup.sh")
check("python3 -m pip" not in setup_script or "python3-pip" in setup_script,
      "setup.sh runs pip but does not install python3-pip")

# 2. docker run IMAGE train
def exec_form(text):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None  # the shell form: signals would reach /bin/sh, not mxtrain


entrypoints = [i for i in runtime if i.startswith("ENTRYPOINT ")]
check(len(entrypoints) == 1 and exec_form(entrypoints[0][len("ENTRYPOINT "):]) == ["/usr/local/bin/mxtrain"],
      "ENTRYPOINT is not the exec form [\"/usr/local/bin/mxtrain\"]")
commands = [i for i in runtime if i.startswith("CMD ")]
check(len(commands) == 1 and exec_form(commands[0][4:]) == ["train"], "CMD is not [\"train\"]")

# 3. the libraries
shutil.rmtree(WORK, ignore_errors=True)
destination = os.path.join(WORK, "runtime-libs")
result = subprocess.run([os.path.join(SOURCE, "scripts", "copy_runtime_libs.sh"), BINARY, destination],
                        capture_output=True, text=True)
check(result.returncode == 0, "copy_runtime_libs.sh failed: " + result.stderr)
listing = subprocess.run(["ldd", BINARY], capture_output=True, text=True, check=True).stdout
excluded = re.compile(r"^(libc\.so|libm\.so|libpthread\.so|libdl\.so|librt\.so|ld-linux|libcuda\.so|libnvidia-)")
expected = {}
for path in re.findall(r"=> (/\S+)", listing):
    name = os.path.basename(path)
    if not excluded.match(name):
        expected[os.path.join(os.path.realpath(os.path.dirname(path)), name)] = os.path.realpath(path)
check(len(expected) > 3, f"ldd listed only {len(expected)} libraries to copy")
copied = set()
for directory, _, files in os.walk(destination):
    for name in files:
        copied.add(os.path.join(directory, name)[len(destination):])
libraries = {path for path in copied if re.search(r"\.so(\.|$)", path) and "/openmpi/" not in path}
check(libraries == set(expected), f"copied {sorted(libraries ^ set(expected))} differently from ldd's list")
for target, source in expected.items():
    check(os.path.isfile(destination + target) and filecmp.cmp(destination + target, source, shallow=False),
          f"{target} is not a copy of {source}")
if any(os.path.basename(t).startswith("libmpi.so") for t in expected):
    check(any("/openmpi/lib/openmpi" in path for path in copied), "Open MPI's plugins were not copied")

# 4. the build context
ignored = [line.strip() for line in read(".dockerignore").splitlines() if line.strip() and not line.startswith("#")]


def is_ignored(path):
    return any(fnmatch.fnmatch(path + "/", pattern) or fnmatch.fnmatch(path, pattern.rstrip("/"))
               or path.startswith(pattern.rstrip("/") + "/") for pattern in ignored)


for needed in ["scripts/setup.sh", "scripts/copy_runtime_libs.sh", "CMakeLists.txt", "CMakePresets.json", "cmake",
               "src", "tests", "configs"]:
    check(not is_ignored(needed), f".dockerignore leaves out {needed}, which the build needs")
check(is_ignored("build"), ".dockerignore lets a host build tree into the context")

print(f"{len(libraries)} libraries copied as ldd lists them; {len(failures)} failure(s)")
sys.exit(1 if failures else 0)
