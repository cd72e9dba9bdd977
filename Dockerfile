# mxtrain as a SageMaker training container (docs/sagemaker.md): `docker run IMAGE train`
# starts a training job, as SageMaker runs a bring-your-own image.
#
# Build stage: the CUDA toolkit with cuDNN, and scripts/setup.sh, the README's way in: it
# installs the Debian/Ubuntu packages, fetches the cudnn-frontend headers and builds the
# `cuda` preset (sm_90 for H100/H200, and sm_100 for B200 when nvcc has it).
# Runtime stage: the CUDA runtime image with cuDNN of the same tag (what cuDNN and NVRTC dlopen
# comes from it), the binary, and exactly the shared libraries `ldd` lists for it
# (scripts/copy_runtime_libs.sh; tests/sagemaker/dockerfile_test.py checks both).
ARG CUDA_IMAGE_TAG=13.0.1-cudnn
ARG UBUNTU=ubuntu24.04

FROM nvidia/cuda:${CUDA_IMAGE_TAG}-devel-${UBUNTU} AS build
ENV DEBIAN_FRONTEND=noninteractive
WORKDIR /src
COPY . /src
RUN MXTRAIN_PRESET=cuda ./scripts/setup.sh \
 && ./build/cuda/mxtrain version \
 && ./scripts/copy_runtime_libs.sh ./build/cuda/mxtrain /runtime-libs

FROM nvidia/cuda:${CUDA_IMAGE_TAG}-runtime-${UBUNTU}
COPY --from=build /runtime-libs/ /
COPY --from=build /src/build/cuda/mxtrain /usr/local/bin/mxtrain
# An unprivileged user for running the image by hand (docker run --user mxtrain). SageMaker
# training jobs run the image as root: the job's /opt/ml directories are mounted from the host.
RUN ldconfig \
 && useradd --create-home --uid 1001 --shell /usr/sbin/nologin mxtrain \
 && mxtrain version
ENTRYPOINT ["/usr/local/bin/mxtrain"]
CMD ["train"]
